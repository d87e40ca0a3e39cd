"""Cases and strategies for the indexer-K gather (``cp_gather_indexer_k_quant_cache``); tensors are built from a
case by :func:`build_gather_inputs`.

What they reach: NORMAL, SHUFFLE and the default layout; odd block sizes (1, 3, 5) and 16, 32, 64 (SHUFFLE
positions past the first 16-token tile); caches that are strided views into a larger pool (padded block stride,
view offset into the pool); empty sequences, rows past the last sequence (nothing to gather), batch ids -1, B and
INT32 extremes, batch ids naming a sequence whose range does not hold the token; tables narrower than a sequence
(invalid table columns), table entries -1, nb and INT32 extremes (invalid blocks); int32 and int64 metadata.
Outputs are poisoned with seeded random bytes before each run. Cache bytes are random, scales included (any fp32
bit pattern: the gather copies bytes).

:class:`CompileOnceCase`: one cache and table geometry, and five or more launches with different token and batch
counts, among them the values Triton's integer specialization distinguishes (1, multiples of 16, others).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case

TOKEN_BYTES = 132
HEAD_BYTES = 128
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1

GatherLayout = Literal["normal", "shuffle", "default"]
IndexDtype = Literal["int32", "int64"]
NORMAL_BLOCK_SIZES = (1, 3, 5, 16, 64)
SHUFFLE_BLOCK_SIZES = (16, 32, 64)
DEFAULT_BLOCK_SIZES = (1, 16, 64)


def _check_layout(layout: str, block_size: int) -> None:
    if block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    resolved = ("normal" if block_size == 1 else "shuffle") if layout == "default" else layout
    if resolved == "shuffle" and block_size % 16:
        raise ValueError(f"block_size: the shuffle layout needs a multiple of 16, got {block_size}")


@dataclass(frozen=True)
class CpGatherCase(Case):
    """One gather: a ``[num_blocks, block_size, 132]`` cache view ``offset_blocks`` blocks into a random byte pool
    (blocks ``block_size * 132 + stride_pad`` bytes apart); sequences of ``seq_lens`` tokens (cu_seqlen their
    prefix sums), each with a ``table_width``-wide row of ``table``; ``extra_tokens`` rows past the last sequence
    (their token_to_seq names the last sequence, or 0 with none); ``token_to_seq_edits`` (t, value) then replace
    entries. ``layout`` "default" passes ``layout=None``. The memory of the other tensors (the same values):
    ``table_layout`` (:data:`TABLE_LAYOUTS`), ``seq_layout`` for cu_seqlen and token_to_seq (:data:`SEQ_LAYOUTS`),
    ``out_layout`` for k_fp8 and k_scale (:data:`OUT_LAYOUTS`)."""

    KIND: ClassVar[str] = "cp-gather"
    ADDED_FIELDS = ('table_layout', 'seq_layout', 'out_layout', 'seq_guard')

    seed: int
    layout: GatherLayout
    block_size: int
    num_blocks: int
    seq_lens: tuple[int, ...]
    table_width: int
    table: tuple[tuple[int, ...], ...]
    stride_pad: int = 0
    offset_blocks: int = 0
    extra_tokens: int = 0
    token_to_seq_edits: tuple[tuple[int, int], ...] = ()
    index_dtype: IndexDtype = "int32"
    table_layout: Literal["contiguous", "slice", "column-major"] = "contiguous"
    seq_layout: Literal["contiguous", "strided"] = "contiguous"
    out_layout: Literal["contiguous", "strided"] = "contiguous"
    #: on a CPU device, cu_seqlen and token_to_seq (packed) end where an unreadable page begins, so a read past
    #: either (a load not masked by its lane's validity) faults; elsewhere they are allocated as usual
    seq_guard: bool = False

    def __post_init__(self):
        super().__post_init__()
        _check_layout(self.layout, self.block_size)
        if self.num_blocks < 0:
            raise ValueError(f"num_blocks: expected an int >= 0, got {self.num_blocks!r}")
        if self.stride_pad < 0 or self.stride_pad % 4 or self.offset_blocks < 0 or self.extra_tokens < 0:
            raise ValueError("stride_pad (a multiple of 4), offset_blocks and extra_tokens must be >= 0")
        if any(n < 0 for n in self.seq_lens):
            raise ValueError(f"seq_lens: expected lengths >= 0, got {list(self.seq_lens)}")
        if self.table_width < 0 or len(self.table) != len(self.seq_lens) or any(
                len(r) != self.table_width for r in self.table):
            raise ValueError(f"table: expected {len(self.seq_lens)} rows of {self.table_width} entries")
        for t, v in self.token_to_seq_edits:
            if not 0 <= t < self.num_tokens:
                raise ValueError(f"token_to_seq_edits: token {t} outside [0, {self.num_tokens})")
        if any(not INT32_MIN <= v <= INT32_MAX for row in self.table for v in row) or any(
                not INT32_MIN <= v <= INT32_MAX for _, v in self.token_to_seq_edits):
            raise ValueError("table and token_to_seq_edits hold int32 values")

    @property
    def num_tokens(self) -> int:
        return sum(self.seq_lens) + self.extra_tokens

    @property
    def num_batches(self) -> int:
        return len(self.seq_lens)

    @property
    def resolved_layout(self) -> str:
        if self.layout != "default":
            return self.layout
        return "normal" if self.block_size == 1 else "shuffle"

    @property
    def cu_seqlen(self) -> list[int]:
        cu = [0]
        for n in self.seq_lens:
            cu.append(cu[-1] + n)
        return cu

    @property
    def token_to_seq(self) -> list[int]:
        tts = [b for b, n in enumerate(self.seq_lens) for _ in range(n)]
        tts += [max(self.num_batches - 1, 0)] * self.extra_tokens
        for t, v in self.token_to_seq_edits:
            tts[t] = v
        return tts

    @property
    def narrow_table(self) -> list[int]:
        """The sequences longer than their table row covers (their tail tokens have no table column)."""
        return [b for b, n in enumerate(self.seq_lens) if -(-n // self.block_size) > self.table_width]


#: the block table packed; a [B, W] slice of a wider, row-offset table whose other entries are valid block ids (a
#: kernel that reads the slice as packed gathers the wrong blocks); column-major (the transpose of a [W, B] table)
TABLE_LAYOUTS = ("contiguous", "slice", "column-major")
#: cu_seqlen and token_to_seq packed, or stride-2 views (the gaps hold -1)
SEQ_LAYOUTS = ("contiguous", "strided")
#: k_fp8 and k_scale packed, or row slices of wider buffers (rows 16 and 4 bytes farther apart, offset 8 bytes)
OUT_LAYOUTS = ("contiguous", "strided")
#: the cache view: blocks packed in a pool of their own, blocks padded apart, or an offset slice of a shared pool
CACHE_LAYOUTS = ("packed", "padded", "pool-slice")


def lay_out_table(table: torch.Tensor, layout: str, num_blocks: int, g: torch.Generator) -> torch.Tensor:
    """``table [B, W]`` with the same entries in the memory of ``layout``."""
    B, W = table.shape
    if layout == "column-major":
        return table.t().contiguous().t()
    if layout == "slice":
        wide = torch.randint(0, num_blocks, (B + 1, W + 3), dtype=table.dtype, generator=g).to(table.device)
        wide[1:, 1:1 + W] = table
        return wide[1:, 1:1 + W]
    return table


def lay_out_vector(v: torch.Tensor, layout: str) -> torch.Tensor:
    """``v`` as a stride-2 view (gaps -1) when ``layout`` is "strided"."""
    if layout != "strided":
        return v
    return torch.stack([v, torch.full_like(v, -1)], dim=1).reshape(-1)[::2]


def _out_rows(rows: torch.Tensor, layout: str, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): ``rows`` (poison bytes) packed, or a row slice of a wider poisoned buffer."""
    if layout != "strided":
        return rows, rows
    T, W = rows.shape
    pad = 16 if W > 4 else 4
    buf = torch.randint(0, 256, (T + 1, W + pad), dtype=torch.uint8, generator=g).to(rows.device)
    view = buf.reshape(-1)[8:8 + T * (W + pad)].as_strided((T, W), (W + pad, 1))
    view.copy_(rows)
    return buf, view


def build_gather_inputs(case: CpGatherCase, device) -> dict:
    """The pool and its cache view, poisoned outputs and the metadata of ``case`` on ``device``, each tensor in the
    case's memory layout (``k_fp8_buf`` / ``k_scale_buf``: the outputs' whole buffers)."""
    g = torch.Generator().manual_seed(case.seed)
    stride = case.block_size * TOKEN_BYTES + case.stride_pad
    pool_blocks = case.offset_blocks + case.num_blocks + 1
    pool = torch.randint(0, 256, (pool_blocks * stride,), dtype=torch.uint8, generator=g).to(device)
    cache = pool[case.offset_blocks * stride:].as_strided((case.num_blocks, case.block_size, TOKEN_BYTES),
                                                          (stride, TOKEN_BYTES, 1))
    if case.num_blocks == 0:  # an empty cache has no storage at all (a null pointer on every device)
        cache = torch.empty((0, case.block_size, TOKEN_BYTES), dtype=torch.uint8, device=device)
    T = case.num_tokens
    k_fp8 = torch.randint(0, 256, (T, HEAD_BYTES), dtype=torch.uint8, generator=g).to(device)
    k_scale = torch.randint(0, 256, (T, 4), dtype=torch.uint8, generator=g).to(device)
    idx = torch.int32 if case.index_dtype == "int32" else torch.int64
    table = torch.tensor(case.table, dtype=idx).reshape(case.num_batches, case.table_width).to(device)
    if case.table_layout != "contiguous" or case.out_layout != "contiguous":  # draws only where a layout needs them
        table = lay_out_table(table, case.table_layout, case.num_blocks, g)
        k_fp8_buf, k_fp8 = _out_rows(k_fp8, case.out_layout, g)
        k_scale_buf, k_scale = _out_rows(k_scale, case.out_layout, g)
    else:
        k_fp8_buf, k_scale_buf = k_fp8, k_scale
    cu = torch.tensor(case.cu_seqlen, dtype=idx).to(device)
    tts = torch.tensor(case.token_to_seq, dtype=idx).to(device)
    if case.seq_guard and cu.device.type == "cpu" and case.seq_layout == "contiguous":
        cu, tts = before_guard_page(cu), before_guard_page(tts)
    return {"pool": pool, "k_cache": cache, "k_fp8": k_fp8, "k_scale": k_scale, "block_table": table,
            "cu_seqlen": lay_out_vector(cu, case.seq_layout), "token_to_seq": lay_out_vector(tts, case.seq_layout),
            "layout": None if case.layout == "default" else case.layout,
            "k_fp8_buf": k_fp8_buf, "k_scale_buf": k_scale_buf}


def before_guard_page(t: torch.Tensor) -> torch.Tensor:
    """A packed CPU copy of ``t`` whose last byte is the last readable byte before a PROT_NONE page (Linux; on
    other systems, or if mprotect fails, the copy without a guard): reading one element past it faults. The
    tensor keeps its anonymous mapping alive."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    nbytes = t.numel() * t.element_size()
    data_pages = max(1, -(-nbytes // page))
    mm = mmap.mmap(-1, (data_pages + 1) * page)
    flat = torch.frombuffer(mm, dtype=torch.uint8)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        libc.mprotect(flat.data_ptr() + data_pages * page, page, 0)  # PROT_NONE
    except (OSError, AttributeError):
        pass
    start = data_pages * page - nbytes
    out = flat[start:start + nbytes].view(t.dtype)
    out.copy_(t.reshape(-1))
    return out


def _invalid_blocks(nb: int) -> list[int]:
    return [-1, nb, nb + 7, INT32_MAX, INT32_MIN]


def _seq_lengths(bs: int) -> list[int]:
    """Lengths that reach a block's second 16-token tile and the next block first, then the edges."""
    long = {1: 7, 32: 35, 64: 20}.get(bs, bs + 3)
    return [long, 0, 1, bs, max(bs - 1, 0), long + 1]


@st.composite
def gather_cases(draw):
    """A :class:`CpGatherCase`: mostly valid chains with a few breaks of each kind. The simplest draw (every list's
    first choice, which a derandomized run starts from) is already a rich case: SHUFFLE blocks of 32, two
    sequences crossing a tile and a block, an invalid table entry, an invalid token and a row past the end."""
    layout = draw(st.sampled_from(["shuffle", "normal", "default", "normal"]))
    sizes = {"normal": (3,) + NORMAL_BLOCK_SIZES, "shuffle": (32,) + SHUFFLE_BLOCK_SIZES,
             "default": DEFAULT_BLOCK_SIZES}[layout]
    bs = draw(st.sampled_from(sizes))
    nb = draw(st.sampled_from([3, 1, 2, 5]))
    B = draw(st.sampled_from([2, 1, 3, 4, 0]))
    max_len = 20 if bs >= 16 else 12
    seq_len = st.one_of(st.sampled_from(_seq_lengths(bs)), st.integers(0, max_len))
    seq_lens = draw(st.lists(seq_len, min_size=B, max_size=B))
    need = max([-(-n // bs) for n in seq_lens] + [1])
    W = draw(st.sampled_from([need, max(need - 1, 0), need + 1]))
    # distinct blocks per row where possible (a swapped pair of blocks shows), then invalid entries planted
    perm = draw(st.permutations(range(nb)))
    rows = [[perm[(b + c) % nb] for c in range(W)] for b in range(B)]
    if B and W:
        edits = draw(st.lists(st.tuples(st.integers(0, B - 1), st.integers(0, W - 1),
                                        st.sampled_from(_invalid_blocks(nb))), min_size=1, max_size=3))
        for b, c, v in edits:
            rows[b][c] = v
    extra = draw(st.sampled_from([1, 0, 3]))
    T = sum(seq_lens) + extra
    bad_batch = st.sampled_from([-1, B, INT32_MAX, INT32_MIN, B + 3] + list(range(B)))
    tts_edits = draw(st.lists(st.tuples(st.integers(0, T - 1), bad_batch), min_size=1, max_size=3)) if T else []
    return CpGatherCase(seed=draw(st.integers(0, 2 ** 31 - 1)), layout=layout, block_size=bs, num_blocks=nb,
                        seq_lens=tuple(seq_lens), table_width=W, table=tuple(tuple(r) for r in rows),
                        stride_pad=draw(st.sampled_from([12, 0, 4, 132])), offset_blocks=draw(st.integers(0, 2)),
                        extra_tokens=extra, token_to_seq_edits=tuple(tts_edits),
                        index_dtype=draw(st.sampled_from(["int32", "int64", "int32"])))


def gather_examples() -> list[CpGatherCase]:
    """Pinned cases, first in every run: each break of the chain at once (NORMAL, odd block size, padded pool
    view), SHUFFLE positions past the first tile across two blocks, the default layout at block size 1, and a
    gather with no sequences (a block table without storage), and one from an empty cache (no storage either)."""
    return [
        CpGatherCase(seed=11, layout="normal", block_size=3, num_blocks=4, seq_lens=(5, 0, 7, 2), table_width=2,
                     table=((3, 1), (2, 2), (0, -1), (4, INT32_MAX)), stride_pad=12, offset_blocks=1,
                     extra_tokens=2, token_to_seq_edits=((1, -1), (6, 4), (7, 0), (13, INT32_MIN))),
        CpGatherCase(seed=12, layout="shuffle", block_size=32, num_blocks=3, seq_lens=(40, 9), table_width=2,
                     table=((2, 0), (1, 3)), stride_pad=4, offset_blocks=2, extra_tokens=1),
        CpGatherCase(seed=13, layout="default", block_size=1, num_blocks=5, seq_lens=(3, 2), table_width=3,
                     table=((4, 0, 2), (1, -1, 3)), index_dtype="int64"),
        # no sequences at all: every token is invalid and the [0, 1] block table has no storage (a null pointer
        # on every device), so a table read that is not masked by its token's validity faults
        CpGatherCase(seed=14, layout="normal", block_size=3, num_blocks=2, seq_lens=(), table_width=1, table=(),
                     extra_tokens=3, token_to_seq_edits=((1, -1),)),
        # no sequences (cu_seqlen is the one entry 0) with cu_seqlen and token_to_seq ending where an unreadable
        # page begins: a metadata read past them (cu_seqlen[1], token_to_seq[T]) not masked by its lane faults
        CpGatherCase(seed=16, layout="normal", block_size=3, num_blocks=2, seq_lens=(), table_width=1, table=(),
                     extra_tokens=3, token_to_seq_edits=((1, -1),), seq_guard=True),
        # an empty cache (no blocks, no storage: a null pointer on every device): every table entry is an invalid
        # block, so each valid token gets a zero scale, and a cache read not masked by its block's validity faults
        CpGatherCase(seed=15, layout="normal", block_size=3, num_blocks=0, seq_lens=(4, 2), table_width=2,
                     table=((0, 1), (-1, 0)), extra_tokens=1),
    ]


# --- compile-once ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompileOnceCase(Case):
    """Launches of one gather geometry (cache ``num_blocks x block_size`` in ``layout``, table width
    ``table_width``) with the (token count, batch count) pairs of ``launches``; sequences split each token count
    over the batch (empty sequences where there are more sequences than tokens), tables of valid blocks. With
    ``table_rows`` > 0 launch i takes rows [i, i + B) of one persistent ``table_rows x table_width`` table, as
    upstream's prefill chunks slice ``block_table[start_idx:end_idx]`` out of the persistent block table; with 0
    each launch gets a table of its own."""

    KIND: ClassVar[str] = "compile-once"

    seed: int
    layout: Literal["normal", "shuffle"]
    block_size: int
    num_blocks: int
    table_width: int
    launches: tuple[tuple[int, int], ...]
    table_rows: int = 0

    #: the contract's promise needs at least this many different token counts and batch counts
    MIN_DISTINCT: ClassVar[int] = 5

    def __post_init__(self):
        super().__post_init__()
        _check_layout(self.layout, self.block_size)
        if self.num_blocks < 1 or self.table_width < 1:
            raise ValueError("num_blocks and table_width must be >= 1")
        for i, (T, B) in enumerate(self.launches):
            if T < 1 or B < 1:
                raise ValueError(f"launches: token and batch counts must be >= 1, got ({T}, {B})")
            if -(-T // B) > self.table_width * self.block_size:
                raise ValueError(f"launches: {T} tokens over {B} sequences do not fit tables of "
                                 f"{self.table_width} blocks of {self.block_size}")
            if self.table_rows and i + B > self.table_rows:
                raise ValueError(f"table_rows: launch {i} takes rows [{i}, {i + B}) of a {self.table_rows}-row table")
        if self.table_rows < 0:
            raise ValueError(f"table_rows: expected 0 or more, got {self.table_rows}")
        if (len({T for T, _ in self.launches}) < self.MIN_DISTINCT
                or len({B for _, B in self.launches}) < self.MIN_DISTINCT):
            raise ValueError(f"launches: need >= {self.MIN_DISTINCT} different token counts and batch counts")


def split_tokens(T: int, B: int) -> list[int]:
    """T tokens over B sequences, as evenly as possible (the first T % B one longer)."""
    return [T // B + (1 if b < T % B else 0) for b in range(B)]


def build_compile_cache(case: CompileOnceCase, device, generator) -> torch.Tensor:
    """The cache every launch of the case reads."""
    return torch.randint(0, 256, (case.num_blocks, case.block_size, TOKEN_BYTES), dtype=torch.uint8,
                         generator=generator).to(device)


def build_persistent_table(case: CompileOnceCase, device, generator) -> "torch.Tensor | None":
    """The persistent table the launches slice rows of (None with ``table_rows == 0``)."""
    if not case.table_rows:
        return None
    return torch.randint(0, case.num_blocks, (case.table_rows, case.table_width), dtype=torch.int32,
                         generator=generator).to(device)


def build_launch_inputs(case: CompileOnceCase, i: int, device, generator, table=None) -> dict:
    """Metadata and fresh outputs of launch ``i``; its block table is rows [i, i + B) of ``table`` (the
    persistent one) when given, else a table of its own."""
    T, B = case.launches[i]
    lens = split_tokens(T, B)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    tts = [b for b, n in enumerate(lens) for _ in range(n)]
    if table is None:
        block_table = torch.randint(0, case.num_blocks, (B, case.table_width), dtype=torch.int32,
                                    generator=generator).to(device)
    else:
        block_table = table[i:i + B]
    return {"k_fp8": torch.empty(T, HEAD_BYTES, dtype=torch.uint8, device=device),
            "k_scale": torch.empty(T, 4, dtype=torch.uint8, device=device),
            "block_table": block_table, "cu_seqlen": torch.tensor(cu, dtype=torch.int32, device=device),
            "token_to_seq": torch.tensor(tts, dtype=torch.int32, device=device)}


#: token counts Triton's integer specialization tells apart: == 1, divisible by 16, neither
_TOKEN_COUNTS = (1, 2, 3, 5, 7, 16, 17, 31, 32, 48)
_BATCH_COUNTS = (1, 2, 3, 4, 5, 6, 16)
#: rows of the persistent table: launch i takes rows [i, i + B) (at most 6 launches, B <= 16)
PERSISTENT_ROWS = 24


@st.composite
def compile_once_cases(draw):
    """Six launches over one geometry whose token counts include 1, a multiple of 16 and others, and whose batch
    counts include 1 and 16, each set with >= 5 different values; tables sliced out of one persistent table
    (first) or fresh per launch."""
    layout = draw(st.sampled_from(["normal", "shuffle"]))
    bs = draw(st.sampled_from(SHUFFLE_BLOCK_SIZES if layout == "shuffle" else NORMAL_BLOCK_SIZES))
    Ts = draw(st.permutations(_TOKEN_COUNTS).map(lambda p: [1, 16] + [x for x in p if x not in (1, 16)][:4]))
    Bs = draw(st.permutations(_BATCH_COUNTS).map(lambda p: [1, 16] + [x for x in p if x not in (1, 16)][:4]))
    order = draw(st.permutations(range(6)))
    launches = tuple((Ts[i], Bs[j]) for i, j in zip(range(6), order))
    width = max(-(-(-(-T // B)) // bs) for T, B in launches)
    return CompileOnceCase(seed=draw(st.integers(0, 2 ** 31 - 1)), layout=layout, block_size=bs,
                           num_blocks=draw(st.integers(1, 4)), table_width=width + draw(st.integers(0, 3)),
                           launches=launches, table_rows=draw(st.sampled_from([PERSISTENT_ROWS, 0])))


def compile_once_examples() -> list[CompileOnceCase]:
    """Token counts 1, 16, 3, 32, 5, 17 and batch counts 1, 16, 2, 3, 5, 4: every class of Triton's integer
    specialization in both counts; fresh tables, then rows of one persistent table 7 entries wide (a row slice
    starts 28 bytes further each launch, so its address is 16-byte aligned only every fourth row)."""
    launches = ((1, 1), (16, 16), (3, 2), (32, 16), (5, 5), (17, 4))
    return [CompileOnceCase(seed=21, layout="normal", block_size=3, num_blocks=3, table_width=6, launches=launches),
            CompileOnceCase(seed=22, layout="normal", block_size=3, num_blocks=3, table_width=7, launches=launches,
                            table_rows=PERSISTENT_ROWS)]


# --- declared dimensions (fuzz.dimensions): the pairs the ci profile reaches on purpose ---------------------------

GATHER_BLOCKS = ("1", "odd", "16", "32", "64")
GATHER_SEQ_CLASSES = ("0", "1", "bs-1", "bs", "bs+1")
TABLE_CLASSES = ("exact", "narrow", "wide")
INVALID_BLOCK_CLASSES = ("none", "-1", "past", "int32")
BAD_BATCH_CLASSES = ("none", "-1", "past", "int32", "wrong-seq")


def _gather_bs(cls: str) -> int:
    return {"1": 1, "odd": 3}.get(cls) or int(cls)


def _gather_block_class(bs: int) -> str:
    return "1" if bs == 1 else (str(bs) if bs in (16, 32, 64) else ("odd" if bs % 2 else "other"))


def _gather_seq_len(cls: str, bs: int) -> int:
    return {"0": 0, "1": 1, "bs-1": bs - 1, "bs": bs, "bs+1": bs + 1}[cls]


def classify_gather(case: CpGatherCase, target) -> dict:
    """The dimension values a gather case hits (the length class is the first sequence's, the invalid entries the
    first ones planted)."""
    bs, nb, B = case.block_size, case.num_blocks, case.num_batches
    out = {"layout": case.layout, "block": _gather_block_class(bs), "index_dtype": case.index_dtype,
           "cache_layout": _cache_layout_class(case), "table_layout": case.table_layout,
           "seq_layout": case.seq_layout, "out_layout": case.out_layout}
    if B:
        n = case.seq_lens[0]
        out["seq"] = next((c for c in GATHER_SEQ_CLASSES if _gather_seq_len(c, bs) == n), "other")
        need = max([-(-m // bs) for m in case.seq_lens] + [1])
        out["table"] = "exact" if case.table_width == need else ("narrow" if case.table_width < need else "wide")
    bad = [v for row in case.table for v in row if not 0 <= v < nb]
    out["invalid_block"] = ("none" if not bad else "-1" if bad[0] == -1 else
                            "int32" if bad[0] in (INT32_MIN, INT32_MAX) else "past" if bad[0] >= nb else "other")
    truth = [b for b, n in enumerate(case.seq_lens) for _ in range(n)] + [max(B - 1, 0)] * case.extra_tokens
    wrong = [v for t, v in case.token_to_seq_edits if v != truth[t]]
    out["bad_batch"] = ("none" if not wrong else "-1" if wrong[0] == -1 else
                        "int32" if wrong[0] in (INT32_MIN, INT32_MAX) else "past" if wrong[0] >= B else
                        "wrong-seq" if wrong[0] >= 0 else "other")
    return out


def _cache_layout_class(case) -> str:
    return "pool-slice" if case.offset_blocks else ("padded" if case.stride_pad else "packed")


def _forced_cache_memory(case, combo: dict) -> tuple[int, int]:
    """(stride_pad, offset_blocks) of ``combo``'s cache layout (as drawn when it names none)."""
    cls = combo.get("cache_layout", _cache_layout_class(case))
    if cls == "packed":
        return 0, 0
    if cls == "padded":
        return case.stride_pad or 12, 0
    return case.stride_pad, max(case.offset_blocks, 1)


def force_gather(case: CpGatherCase, combo: dict, target) -> CpGatherCase:
    """``case`` rewritten to hit ``combo``: layout and block size, the first sequence's length, the table's width
    (valid blocks), then one invalid block at the first entry and one bad batch id at the first token."""
    layout = combo.get("layout", case.layout)
    bs = _gather_bs(combo["block"]) if "block" in combo else case.block_size
    nb = case.num_blocks
    lens = list(case.seq_lens) or [0]
    lens = [min(n, 2 * bs + 1) for n in lens]
    if "seq" in combo:
        lens[0] = _gather_seq_len(combo["seq"], bs)
    need = max([-(-n // bs) for n in lens] + [1])
    if combo.get("table") == "narrow" and need == 1:  # a narrow table of width 0 has no entry to plant into
        lens.append(bs + 1)
        need = 2
    width = {"exact": need, "narrow": need - 1, "wide": need + 1}[combo.get("table", "exact")]
    B = len(lens)
    # not symmetric in (b, c): a table read across rows instead of along them names other blocks
    rows = [[(2 * b + c + case.seed) % nb for c in range(width)] for b in range(B)]
    inv = combo.get("invalid_block", "none")
    if inv != "none" and width:
        rows[0][0] = {"-1": -1, "past": nb + case.seed % 8, "int32": (INT32_MAX, INT32_MIN)[case.seed % 2]}[inv]
    extra = case.extra_tokens
    bad = combo.get("bad_batch", "none")
    if bad != "none" and sum(lens) + extra == 0:
        extra = 1
    edits = ()
    if bad != "none":
        truth0 = 0 if lens[0] else (next((b for b, n in enumerate(lens) if n), B - 1))
        value = {"-1": -1, "past": B + case.seed % 4, "int32": (INT32_MAX, INT32_MIN)[case.seed % 2],
                 "wrong-seq": (truth0 + 1) % (B + 1)}[bad]
        if bad == "wrong-seq" and value >= B:  # one sequence only: a second, empty one to point at
            lens, rows, B = lens + [0], rows + [[0] * width], B + 1
            value = (truth0 + 1) % B
        edits = ((0, value),)
    pad, offset = _forced_cache_memory(case, combo)
    return CpGatherCase(seed=case.seed, layout=layout, block_size=bs, num_blocks=nb, seq_lens=tuple(lens),
                        table_width=width, table=tuple(tuple(r) for r in rows), stride_pad=pad,
                        offset_blocks=offset, extra_tokens=extra, token_to_seq_edits=edits,
                        index_dtype=combo.get("index_dtype", case.index_dtype),
                        table_layout=combo.get("table_layout", case.table_layout),
                        seq_layout=combo.get("seq_layout", case.seq_layout),
                        out_layout=combo.get("out_layout", case.out_layout))


def _gather_allowed(c: dict, target) -> bool:
    layout, block, seq = c.get("layout"), c.get("block"), c.get("seq")
    if layout == "shuffle" and block in ("1", "odd"):
        return False
    if layout == "default" and block == "odd":
        return False
    if block == "1" and seq in ("bs-1", "bs"):  # the same lengths as "0" and "1"
        return False
    return True


def _declare_gather():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "cp-gather",
        (Dimension("layout", ("normal", "shuffle", "default")),
         Dimension("block", GATHER_BLOCKS, "block size: 1, odd, and the SHUFFLE tile multiples 16, 32, 64"),
         Dimension("seq", GATHER_SEQ_CLASSES, "the first sequence's length around the block size"),
         Dimension("table", TABLE_CLASSES, "the table width against the blocks the longest sequence needs"),
         Dimension("invalid_block", INVALID_BLOCK_CLASSES, "a table entry -1, past the cache, INT32 extremes"),
         Dimension("bad_batch", BAD_BATCH_CLASSES, "a token's batch id: -1, >= B, INT32 extremes, another seq's"),
         Dimension("index_dtype", ("int32", "int64")),
         Dimension("cache_layout", CACHE_LAYOUTS, "the cache view's memory: packed, blocks padded apart, an offset "
                                                  "slice of a shared pool"),
         Dimension("table_layout", TABLE_LAYOUTS, "block_table packed, a slice of a wider table, column-major"),
         Dimension("seq_layout", SEQ_LAYOUTS, "cu_seqlen and token_to_seq packed or stride-2 views"),
         Dimension("out_layout", OUT_LAYOUTS, "k_fp8 and k_scale packed or row slices of wider buffers")),
        (("layout", "block"), ("block", "seq"), ("invalid_block", "index_dtype"), ("bad_batch", "index_dtype"),
         ("cache_layout", "layout"), ("table_layout", "index_dtype"), ("table_layout", "invalid_block"),
         ("seq_layout", "bad_batch"), ("out_layout", "layout")),
        classify_gather, force_gather, _gather_allowed), "gather-oracle-exact")


GATHER_DIMENSIONS = _declare_gather()


# --- compile-once's declared dimensions --------------------------------------------------------------------------

COMPILE_BLOCKS = ("1", "odd", "16", "32", "64")
#: where launch i's block table comes from: a table of its own, or rows [i, i + B) of one persistent table whose row
#: stride (4 * width bytes) is a multiple of 16 ("persistent-aligned": every slice 16-byte aligned) or not (a slice's
#: address is aligned only every few rows: Triton's pointer-alignment specialization tells the launches apart)
COMPILE_TABLES = ("fresh", "persistent-aligned", "persistent-unaligned")


def classify_compile_once(case: CompileOnceCase, target) -> dict:
    """The dimension values a compile-once case hits."""
    table = ("fresh" if not case.table_rows else
             "persistent-aligned" if case.table_width % 4 == 0 else "persistent-unaligned")
    return {"layout": case.layout, "block": _gather_block_class(case.block_size), "table": table}


def force_compile_once(case: CompileOnceCase, combo: dict, target) -> CompileOnceCase:
    """``case`` rewritten to hit ``combo``: layout and block size, the table width the launches need (rounded to
    the table class's row alignment) and the table's source; the launches as drawn."""
    layout = combo.get("layout", case.layout)
    bs = _gather_bs(combo["block"]) if "block" in combo else case.block_size
    need = max(-(-(-(-T // B)) // bs) for T, B in case.launches)
    width = max(need, case.table_width) if bs == case.block_size else need
    table = combo.get("table", classify_compile_once(case, target)["table"])
    rows = 0
    if table != "fresh":
        rows = max(PERSISTENT_ROWS, max(i + B for i, (_, B) in enumerate(case.launches)))
        if table == "persistent-aligned":
            width = -(-width // 4) * 4
        elif width % 4 == 0:
            width += 1
    return CompileOnceCase(seed=case.seed, layout=layout, block_size=bs, num_blocks=case.num_blocks,
                           table_width=width, launches=case.launches, table_rows=rows)


def _compile_once_allowed(c: dict, target) -> bool:
    layout, block = c.get("layout"), c.get("block")
    if layout == "shuffle" and block in ("1", "odd"):
        return False
    if layout == "normal" and block == "32":  # the generator's normal sizes: 1, odd, 16, 64
        return False
    return True


def _declare_compile_once():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "compile-once",
        (Dimension("layout", ("normal", "shuffle"), "the cache layout (a constexpr of the kernel)"),
         Dimension("block", COMPILE_BLOCKS, "block size: 1, odd, and the SHUFFLE tile multiples 16, 32, 64"),
         Dimension("table", COMPILE_TABLES, "per-launch tables, or row slices of one persistent table by alignment")),
        (("layout", "block"), ("layout", "table")),
        classify_compile_once, force_compile_once, _compile_once_allowed,
        examples=lambda target: compile_once_examples()), "compile-once")


COMPILE_ONCE_DIMENSIONS = _declare_compile_once()
