"""Cases, strategies and input builders for the indexer logits and top-k (``impl.indexer_logits``).

What they reach: decode with next_n 1 and 2, per-request and per-row ([B, next_n]) context lengths, lengths 0, at
and one past a block boundary, and rows that see nothing (ctx < next_n); block sizes 1, 3, 16, 64 (SHUFFLE on 16
and 64); a poisoned pool (every byte no visible position reads is the flavour's NaN code: unreferenced blocks,
the tail of each request's last page, and the table columns past its pages, which name poisoned blocks, so a
kernel that reads past a row's length returns NaN instead of -inf); prefill rows with empty ranges and keys no row
sees (poisoned too); a top-k larger than the candidate count; exact ties (values on a coarse grid, keys repeating
three rows: runs of equal logits at the top-k boundary, many exact zeros after the relu); NaN codes in q or in a visible key, infinite, NaN and negative key scales; heads
counts below and at the MMA tile (1..16); the logits into a caller's ``out`` whose rows are padded (poisoned columns
after each row, which no store may reach).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case
from impl.formats import INDEXER_TOKEN_BYTES, fp8_encode, pack_indexer_k
from impl.runtime import kernel_device

FP8_TORCH = {"ocp": torch.float8_e4m3fn, "fnuz": torch.float8_e4m3fnuz}
NAN_CODE = {"ocp": 0x7F, "fnuz": 0x80}
BLOCK_SIZES = (1, 3, 16, 64)
#: poisoned bytes between the token rows of a "padded-rows" cache view
ROW_PAD = 4
HEADS = (1, 2, 4, 8, 16)
#: columns after each row of a "padded" out (at least a tile's width, so a store spilling past a row's last column
#: lands in that row's padding, not in the next row, which rewrites it), and the value they hold
OUT_PAD = 64
OUT_POISON = -12345.5


@dataclass(frozen=True)
class IndexerLogitsCase(Case):
    """One logits + top-k call. ``mode`` "decode": ``context_lens`` (one per request, or one per row when
    ``per_row``) over a paged cache of ``block_size`` in ``layout``, table columns past each request's pages
    (``extra_columns``) and ``spare_blocks`` pool blocks no column names, all poisoned. ``mode`` "prefill":
    ``keys`` gathered keys, row t sees [row_starts[t], row_ends[t]). ``values``: "normal" (N(0, 1) codes), "ties"
    (a coarse grid: exact ties), "wide" (codes drawn from every finite code: subnormals to the flavour's max;
    scales of either sign) or "zero-cut" (three keys in four all-zero codes: their logits are exact zeros, and the
    top-k cut falls inside that run of equal logits; each row's head weights share one sign and one zero key in
    three has a negative scale (bytes no writer stores), so -0 and +0 sit side by side in every row; the remaining
    keys N(0, 1)).
    ``nan_q``/``nan_k`` plant a NaN code in q / in one visible key; ``bad_scale`` makes one visible key's scale
    inf, NaN or negative (bytes a writer never stores; the formula still holds)."""

    KIND: ClassVar[str] = "indexer-logits-agreement"
    ADDED_FIELDS = ('q_layout', 'weights_layout', 'out_rows')

    seed: int
    mode: Literal["decode", "prefill"]
    heads: int
    topk: int
    values: Literal["normal", "ties", "wide", "zero-cut"] = "normal"
    nan_q: bool = False
    nan_k: bool = False
    bad_scale: Literal["none", "inf", "nan", "negative"] = "none"
    next_n: int = 1
    block_size: int = 16
    layout: Literal["normal", "shuffle"] = "normal"
    context_lens: tuple[int, ...] = ()
    per_row: bool = False
    max_model_len: int = 1
    extra_columns: int = 0
    spare_blocks: int = 1
    keys: int = 0
    row_starts: tuple[int, ...] = ()
    row_ends: tuple[int, ...] = ()
    #: decode: "padded-rows" hands the subject a view of the cache whose token rows lie ``ROW_PAD`` poisoned bytes
    #: apart (row stride 132 + ROW_PAD, not 132): block-contiguous only at block size 1, else a view the subject must
    #: refuse or read as the view says; "unit-heads" hands it as upstream's ``[nb, bs, 1, 132]`` view of the same
    #: flat bytes (``unsqueeze(2)``, the form the entry point documents besides ``[nb, bs, 132]``), read the same
    cache_view: Literal["flat", "padded-rows", "unit-heads"] = "flat"
    #: decode at next_n >= 2: "long" first calls with a 1-D ``context_lens`` longer than q's requests (the per-row
    #: lengths flattened, B * next_n entries), which the subject must refuse
    ctx_count: Literal["exact", "long"] = "exact"
    #: the memory q and the head weights are handed in (the same values): :data:`Q_LAYOUTS`, :data:`WEIGHTS_LAYOUTS`
    q_layout: Literal["contiguous", "padded", "heads-major", "lane-strided"] = "contiguous"
    weights_layout: Literal["contiguous", "padded", "column-major"] = "contiguous"
    #: the logits' memory: "fresh" (the subject allocates it, ``out=None``) or "padded" (``out=`` a slice of a wider
    #: buffer: each row followed by ``OUT_PAD`` columns of ``OUT_POISON``, which no store may touch)
    out_rows: Literal["fresh", "padded"] = "fresh"

    def __post_init__(self):
        super().__post_init__()
        if self.heads < 1 or self.topk < 1 or self.seed < 0:
            raise ValueError("heads and topk must be >= 1, seed >= 0")
        if self.mode == "decode":
            if self.next_n < 1 or self.block_size < 1 or self.max_model_len < 1:
                raise ValueError("next_n, block_size and max_model_len must be >= 1")
            if self.layout == "shuffle" and self.block_size % 16:
                raise ValueError(f"layout shuffle needs a block size that is a multiple of 16, got {self.block_size}")
            if not self.context_lens or any(c < 0 for c in self.context_lens):
                raise ValueError("context_lens: expected at least one length, all >= 0")
            if self.per_row and len(self.context_lens) % self.next_n:
                raise ValueError("context_lens: per-row lengths come next_n per request")
            if max(max(v) for v in self.visible()) > self.max_model_len:
                raise ValueError("context_lens: a row sees more than max_model_len positions")
            if self.extra_columns < 0 or self.spare_blocks < 1:
                raise ValueError("extra_columns must be >= 0 and spare_blocks >= 1 (the poisoned blocks)")
            if self.ctx_count == "long" and self.next_n < 2:
                raise ValueError("ctx_count long: the per-row lengths flattened need next_n >= 2")
        elif self.cache_view != "flat" or self.ctx_count != "exact":
            raise ValueError("prefill: cache_view and ctx_count are decode fields (flat, exact)")
        else:
            T = len(self.row_starts)
            if T < 1 or len(self.row_ends) != T or self.keys < 1:
                raise ValueError("prefill: expected >= 1 row with a start and an end, and >= 1 key")
            if any(not 0 <= lo <= hi <= self.keys for lo, hi in zip(self.row_starts, self.row_ends)):
                raise ValueError("prefill: expected 0 <= row_starts <= row_ends <= keys")

    @property
    def batch(self) -> int:
        return len(self.context_lens) // (self.next_n if self.per_row else 1)

    def visible(self) -> list[list[int]]:
        """Positions row (b, j) sees: ctx - next_n + j + 1 (at least 0), or the per-row length itself."""
        n = self.next_n
        if self.per_row:
            return [list(self.context_lens[b * n:(b + 1) * n]) for b in range(self.batch)]
        return [[max(c - n + j + 1, 0) for j in range(n)] for c in self.context_lens]


def _context_len(draw, bs: int) -> int:
    kind = draw(st.sampled_from(["zero", "boundary", "boundary+1", "boundary-1", "any", "any"]))
    pages = draw(st.integers(1, 3 if bs < 64 else 2))
    cap = 40 if bs == 1 else 130
    if kind == "zero":
        return 0
    if kind == "boundary":
        return min(pages * bs, cap)
    if kind == "boundary+1":
        return min(pages * bs + 1, cap)
    if kind == "boundary-1":
        return max(min(pages * bs - 1, cap), 0)
    return draw(st.integers(0, min(3 * bs, cap)))


def _common(draw) -> dict:
    return dict(
        seed=draw(st.integers(0, 2 ** 31 - 1)),
        heads=draw(st.sampled_from(HEADS)),
        values=draw(st.sampled_from(["normal", "normal", "ties", "wide"])),
        nan_q=draw(st.booleans()) and draw(st.booleans()),
        nan_k=draw(st.booleans()) and draw(st.booleans()),
        bad_scale=draw(st.sampled_from(["none", "none", "inf", "nan", "negative"])),
        q_layout=draw(st.sampled_from(["contiguous", "contiguous"] + list(Q_LAYOUTS[1:]))),
        weights_layout=draw(st.sampled_from(["contiguous", "contiguous"] + list(WEIGHTS_LAYOUTS[1:]))),
        out_rows=draw(st.sampled_from(["fresh", "fresh", "fresh", "padded"])),
    )


GEOMETRIES = ((1, "normal"), (3, "normal"), (16, "normal"), (16, "shuffle"), (64, "normal"), (64, "shuffle"))
#: decode with one query row per request, MTP rows from one length per request, MTP rows with per-row lengths
DECODE_SHAPES = ((1, False), (2, False), (2, True))


@st.composite
def decode_cases(draw) -> IndexerLogitsCase:
    base = _common(draw)
    bs, layout = draw(st.sampled_from(GEOMETRIES))
    next_n, per_row = draw(st.sampled_from(DECODE_SHAPES))
    B = draw(st.integers(1, 3))
    ctx = [_context_len(draw, bs) for _ in range(B)]
    if per_row:
        # the MTP shape (ctx - next_n + j + 1) or any lengths, one per row
        lens = []
        for c in ctx:
            if draw(st.booleans()):
                lens += [max(c - next_n + j + 1, 0) for j in range(next_n)]
            else:
                lens += [draw(st.integers(0, max(c, 1))) for _ in range(next_n)]
        ctx = lens
    case = IndexerLogitsCase(mode="decode", topk=1, next_n=next_n, block_size=bs, layout=layout,
                             context_lens=tuple(ctx), per_row=per_row, max_model_len=1 << 20, **base)
    longest = max(max(v) for v in case.visible())
    return case.replace(max_model_len=max(1, longest + draw(st.integers(0, 5))),
                        topk=draw(st.integers(1, longest + 3)),
                        extra_columns=draw(st.integers(0, 2)), spare_blocks=draw(st.integers(1, 2)),
                        cache_view=draw(st.sampled_from(["flat", "flat", "flat", "padded-rows"])),
                        ctx_count=draw(st.sampled_from(["exact", "exact", "exact", "long"])) if next_n > 1
                        else "exact")


@st.composite
def prefill_cases(draw) -> IndexerLogitsCase:
    base = _common(draw)
    S = draw(st.integers(1, 40))
    T = draw(st.integers(1, 4))
    starts, ends = [], []
    for _ in range(T):
        lo = draw(st.integers(0, S))
        hi = lo if draw(st.integers(0, 4)) == 0 else draw(st.integers(lo, S))
        starts.append(lo)
        ends.append(hi)
    longest = max(e - s for s, e in zip(starts, ends))
    return IndexerLogitsCase(mode="prefill", topk=draw(st.integers(1, longest + 3)), keys=S,
                             row_starts=tuple(starts), row_ends=tuple(ends), **base)


@st.composite
def indexer_logits_cases(draw) -> IndexerLogitsCase:
    """Decode three times in four, prefill otherwise."""
    if draw(st.integers(0, 3)) == 3:
        return draw(prefill_cases())
    return draw(decode_cases())


# --- inputs ------------------------------------------------------------------------------------------------------

@dataclass
class DecodeInputs:
    q: torch.Tensor             # [B, next_n, H, 128] platform fp8
    q_codes: torch.Tensor       # the same bits as uint8 (CPU)
    cache: torch.Tensor         # [nb, bs, 132] uint8
    weights: torch.Tensor       # [B * next_n, H] fp32
    context_lens: torch.Tensor  # [B] or [B, next_n] int32
    block_table: torch.Tensor   # [B, W] int32
    table: list                 # the same as lists
    visible: list


@dataclass
class PrefillInputs:
    q: torch.Tensor        # [T, H, 128] platform fp8
    q_codes: torch.Tensor
    k_fp8: torch.Tensor    # [S, 128] platform fp8
    k_codes: torch.Tensor
    k_scale: torch.Tensor  # [S] fp32
    weights: torch.Tensor  # [T, H] fp32
    ks: torch.Tensor       # [T] int32
    ke: torch.Tensor


def _codes(gen: torch.Generator, shape, values: str, flavour: str) -> torch.Tensor:
    if values == "ties":
        grid = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.5, 2.0])
        x = grid[torch.randint(0, len(grid), shape, generator=gen)]
        return fp8_encode(x, flavour)
    if values == "wide":
        c = torch.randint(0, 256, shape, generator=gen).to(torch.uint8)
        nan = NAN_CODE[flavour]
        bad = (c == nan) | ((c & 0x7F) == 0x7F) if flavour == "ocp" else (c == nan)
        return torch.where(bad, torch.zeros_like(c), c)
    return fp8_encode(torch.randn(shape, generator=gen), flavour)


def _key_codes(gen: torch.Generator, n: int, values: str, flavour: str) -> torch.Tensor:
    """[n, 128] key codes; with "ties" every key is one of three rows, so a row's logits take at most three values
    and a top-k boundary falls inside a run of equal logits."""
    codes = _codes(gen, (n, 128), values, flavour)
    if values == "zero-cut" and n:
        codes[torch.arange(n) % 4 != 1] = 0  # code 0 is +0 in both flavours (0x80 is FNUZ's NaN)
    if values == "ties" and n:
        codes = codes[:3][torch.randint(0, min(3, n), (n,), generator=gen)]
    return codes


def _scales(gen: torch.Generator, n: int, values: str) -> torch.Tensor:
    if values == "ties":
        return torch.full((n,), 0.25)
    if values == "zero-cut":  # every other zero key's scale negative: +0 and -0 logits side by side in one row
        return torch.where(torch.arange(n) % 4 == 2, -0.25, 0.25).to(torch.float32)
    e = torch.randint(-10, 1, (n,), generator=gen).to(torch.float32)
    s = (torch.rand(n, generator=gen) + 0.5) * torch.exp2(e)
    if values == "wide":  # any bytes: a negative scale too (the writer never stores one; the formula holds)
        s = torch.where(torch.rand(n, generator=gen) < 0.5, -s, s)
    return s.to(torch.float32)


def _weights(gen: torch.Generator, shape, values: str) -> torch.Tensor:
    if values == "ties":
        grid = torch.tensor([1.0, 0.5, -0.5, 0.25])
        return grid[torch.randint(0, len(grid), shape, generator=gen)].to(torch.float32)
    if values == "zero-cut":  # every head of a row one sign: its zero logits are all -0 (even rows) or all +0
        mag = torch.rand(shape, generator=gen) * 0.5 + 0.25
        sign = torch.where(torch.arange(shape[0]) % 2 == 0, -1.0, 1.0).reshape(-1, *([1] * (len(shape) - 1)))
        return (mag * sign).to(torch.float32)
    return (torch.randn(shape, generator=gen) * 0.5).to(torch.float32)


def _plant(gen, case: IndexerLogitsCase, q_codes, k_codes, k_scale, live_keys: list[int], flavour: str) -> None:
    """NaN in q, NaN in a visible key, a non-finite scale on a visible key, as the case asks (in place)."""
    if case.nan_q:
        idx = tuple(int(torch.randint(0, s, (1,), generator=gen)) for s in q_codes.shape)
        q_codes[idx] = NAN_CODE[flavour]
    if live_keys and case.nan_k:
        s = live_keys[int(torch.randint(0, len(live_keys), (1,), generator=gen))]
        k_codes[s, int(torch.randint(0, 128, (1,), generator=gen))] = NAN_CODE[flavour]
    if live_keys and case.bad_scale != "none":
        s = live_keys[int(torch.randint(0, len(live_keys), (1,), generator=gen))]
        k_scale[s] = {"inf": float("inf"), "nan": float("nan"), "negative": -abs(float(k_scale[s]))}[case.bad_scale]


def build_decode_inputs(case: IndexerLogitsCase, flavour: str, device: str | None = None) -> DecodeInputs:
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed)
    bs, n, H = case.block_size, case.next_n, case.heads
    vis = case.visible()
    B = len(vis)
    pages = [(max(v) + bs - 1) // bs for v in vis]
    W = max(1, max(pages) + case.extra_columns)
    real = sum(pages)
    nb = real + case.spare_blocks
    perm = torch.randperm(nb, generator=gen).tolist()
    live_blocks, poisoned = perm[:real], perm[real:]
    table, slots = [], []
    it = iter(live_blocks)
    for b in range(B):
        row = [next(it) for _ in range(pages[b])]
        row += [poisoned[int(torch.randint(0, len(poisoned), (1,), generator=gen))] for _ in range(W - pages[b])]
        table.append(row)
        slots += [row[p // bs] * bs + p % bs for p in range(max(vis[b]))]
    cache = torch.full((nb, bs, INDEXER_TOKEN_BYTES), NAN_CODE[flavour], dtype=torch.uint8)
    k_codes = _key_codes(gen, len(slots), case.values, flavour)
    k_scale = _scales(gen, len(slots), case.values)
    q_codes = _codes(gen, (B, n, H, 128), case.values, flavour)
    _plant(gen, case, q_codes, k_codes, k_scale, list(range(len(slots))), flavour)
    if slots:
        pack_indexer_k(cache, slots, k_codes, k_scale, layout=case.layout)
    weights = _weights(gen, (B * n, H), case.values)
    if case.per_row:
        ctx = torch.tensor(case.context_lens, dtype=torch.int32).reshape(B, n)
    else:
        ctx = torch.tensor(case.context_lens, dtype=torch.int32)
    q_dev = q_codes.to(device)
    return DecodeInputs(q=q_dev.view(FP8_TORCH[flavour]), q_codes=q_codes, cache=cache.to(device),
                        weights=weights.to(device), context_lens=ctx.to(device),
                        block_table=torch.tensor(table, dtype=torch.int32).to(device), table=table, visible=vis)


def padded_rows_view(cache: torch.Tensor, flavour: str) -> torch.Tensor:
    """The same [nb, bs, 132] bytes as a view whose token rows are ``132 + ROW_PAD`` bytes apart (the gaps hold the
    flavour's NaN code): a cache carved from a wider allocation."""
    nb, bs, width = cache.shape
    base = torch.full((nb, bs, width + ROW_PAD), NAN_CODE[flavour], dtype=torch.uint8, device=cache.device)
    base[:, :, :width] = cache
    return base[:, :, :width]


def long_context_lens(case: IndexerLogitsCase, device=None) -> torch.Tensor:
    """A 1-D ``context_lens`` with more entries than q has requests (next_n >= 2): every row's visible length,
    flattened (B * next_n entries, which a reader of per-request lengths would misread). At next_n 1 a longer
    ``context_lens`` is only padding past the batch, which a subject may ignore, so it is not made."""
    if case.next_n < 2:
        raise ValueError("long_context_lens: needs next_n >= 2")
    return torch.tensor([v for row in case.visible() for v in row], dtype=torch.int32, device=device)


def build_prefill_inputs(case: IndexerLogitsCase, flavour: str, device: str | None = None) -> PrefillInputs:
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed)
    S, T, H = case.keys, len(case.row_starts), case.heads
    seen = sorted({s for lo, hi in zip(case.row_starts, case.row_ends) for s in range(lo, hi)})
    k_codes = _key_codes(gen, S, case.values, flavour)
    k_scale = _scales(gen, S, case.values)
    unseen = torch.ones(S, dtype=torch.bool)
    unseen[seen] = False
    k_codes[unseen] = NAN_CODE[flavour]  # poison: no row may read these keys
    k_scale[unseen] = float("nan")
    q_codes = _codes(gen, (T, H, 128), case.values, flavour)
    _plant(gen, case, q_codes, k_codes, k_scale, seen, flavour)
    weights = _weights(gen, (T, H), case.values)
    fp8 = FP8_TORCH[flavour]
    return PrefillInputs(q=q_codes.to(device).view(fp8), q_codes=q_codes, k_fp8=k_codes.to(device).view(fp8),
                         k_codes=k_codes, k_scale=k_scale.to(device), weights=weights.to(device),
                         ks=torch.tensor(case.row_starts, dtype=torch.int32).to(device),
                         ke=torch.tensor(case.row_ends, dtype=torch.int32).to(device))


def padded_out(rows: int, cols: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(wide, out): an fp32 ``out [rows, cols]`` (unit column stride, rows ``cols + OUT_PAD`` apart) carved from
    ``wide``, whose columns past ``cols`` hold ``OUT_POISON`` (the "padded" out of :class:`IndexerLogitsCase`)."""
    wide = torch.full((rows, cols + OUT_PAD), OUT_POISON, dtype=torch.float32, device=device)
    return wide, wide[:, :cols]


# --- memory layouts of q and the weights (issue 30 item 1) --------------------------------------------------------

#: q's codes packed; each head's 128 lanes in a 144-byte slot (head and row strides padded, lanes unit-stride);
#: heads outermost (a permuted [H, ..., 128] tensor: every stride but the lanes' differs); lanes two bytes apart
#: (a lane-strided view, which a reader of packed lanes misreads)
Q_LAYOUTS = ("contiguous", "padded", "heads-major", "lane-strided")
#: the [rows, H] weights packed; a slice of a wider, row-offset table; column-major (heads stride = rows)
WEIGHTS_LAYOUTS = ("contiguous", "padded", "column-major")


def lay_out_q(q: torch.Tensor, layout: str, flavour: str) -> torch.Tensor:
    """fp8 ``q [..., 128]`` with the same codes in the memory of ``layout`` (the extra bytes the flavour's NaN)."""
    codes = q.view(torch.uint8)
    if layout == "heads-major":  # heads are dim -2: put them outermost in memory
        perm = [codes.dim() - 2] + list(range(codes.dim() - 2)) + [codes.dim() - 1]
        inv = [perm.index(i) for i in range(codes.dim())]
        return codes.permute(perm).contiguous().permute(inv).view(q.dtype)
    if layout in ("padded", "lane-strided"):
        width = 144 if layout == "padded" else 256
        wide = torch.full((*codes.shape[:-1], width), NAN_CODE[flavour], dtype=torch.uint8, device=codes.device)
        if layout == "padded":
            wide[..., :128] = codes
            return wide[..., :128].view(q.dtype)
        wide[..., ::2] = codes
        return wide[..., ::2].view(q.dtype)
    return q


def lay_out_weights(w: torch.Tensor, layout: str) -> torch.Tensor:
    """``w [rows, H]`` with the same values in the memory of ``layout`` (the extra elements NaN)."""
    if layout == "column-major":
        return w.t().contiguous().t()
    if layout == "padded":
        R, H = w.shape
        wide = torch.full((R + 1, H + 3), float("nan"), dtype=w.dtype, device=w.device)
        wide[1:, 1:1 + H] = w
        return wide[1:, 1:1 + H]
    return w


# --- declared dimensions (fuzz.dimensions): the pairs the ci profile reaches on purpose ---------------------------

LOGITS_GEOMETRIES = tuple(f"bs{bs}" + ("-shuffle" if lay == "shuffle" else "") for bs, lay in GEOMETRIES) + (
    "prefill",)
LOGITS_SHAPES = ("single", "mtp", "mtp-per-row")
LOGITS_CTX = ("0", "page-1", "page", "page+1")
LOGITS_TOPK = ("below", "equal", "above")
#: the value classes (see IndexerLogitsCase): "zero-cut" puts exact signed zeros at the top-k cut itself
LOGITS_VALUES = ("normal", "ties", "wide", "zero-cut")
LOGITS_POISON = ("none", "nan-q", "nan-k", "inf-scale", "nan-scale", "negative-scale")
#: the cache as given; a view whose token rows are not 132 bytes apart at block size 1 (still block-contiguous:
#: read) and above it (not block-contiguous: refused or read as the view says)
LOGITS_VIEWS = ("flat", "padded-bs1", "padded-blocks")
LOGITS_CTX_COUNTS = ("exact", "long")


def _longest(case: IndexerLogitsCase) -> int:
    if case.mode == "prefill":
        return max(e - s for s, e in zip(case.row_starts, case.row_ends))
    return max(max(v) for v in case.visible())


def classify_logits(case: IndexerLogitsCase, target) -> dict:
    """The dimension values an indexer-logits case hits (the length class is the first request's / row's)."""
    out = {"values": case.values, "q_layout": case.q_layout, "weights_layout": case.weights_layout}
    out["poison"] = ("nan-q" if case.nan_q else "nan-k" if case.nan_k else
                     "none" if case.bad_scale == "none" else f"{case.bad_scale}-scale")
    longest = _longest(case)
    out["topk"] = "below" if case.topk < longest else ("equal" if case.topk == longest else "above")
    if case.mode == "prefill":
        out.update(geometry="prefill", shape="single",
                   ctx="0" if case.row_ends[0] == case.row_starts[0] else "other", view="flat", ctx_count="exact")
        return out
    bs = case.block_size
    out["geometry"] = f"bs{bs}" + ("-shuffle" if case.layout == "shuffle" else "")
    out["shape"] = "single" if case.next_n == 1 else ("mtp-per-row" if case.per_row else "mtp")
    # "unit-heads" is the flat bytes (token rows 132 bytes apart) with a unit heads dim: the "flat" class
    out["view"] = "flat" if case.cache_view in ("flat", "unit-heads") else (
        "padded-bs1" if bs == 1 else "padded-blocks")
    out["ctx_count"] = case.ctx_count
    c = case.context_lens[0]
    out["ctx"] = next((k for k, n in (("0", 0), ("page-1", bs - 1), ("page", bs), ("page+1", bs + 1)) if c == n),
                      "other")
    return out


def force_logits(case: IndexerLogitsCase, combo: dict, target) -> IndexerLogitsCase:
    """``case`` rewritten to hit ``combo``: geometry, shape and the first length class (lengths rebuilt), the
    top-k against the longest visible row, value kind and one planted poison."""
    geometry = combo.get("geometry", classify_logits(case, target)["geometry"])
    poison = combo.get("poison")
    common = dict(seed=case.seed, heads=case.heads, values=combo.get("values", case.values),
                  q_layout=combo.get("q_layout", case.q_layout),
                  weights_layout=combo.get("weights_layout", case.weights_layout), out_rows=case.out_rows)
    if poison is not None:
        common.update(nan_q=poison == "nan-q", nan_k=poison == "nan-k",
                      bad_scale=poison[:-len("-scale")] if poison.endswith("-scale") else "none")
    else:
        common.update(nan_q=case.nan_q, nan_k=case.nan_k, bad_scale=case.bad_scale)
    topk_cls = combo.get("topk", "above")
    if geometry == "prefill":
        if case.mode == "prefill":
            starts, ends, keys = list(case.row_starts), list(case.row_ends), case.keys
        else:
            starts, ends, keys = [0, 1], [0, 6], 8
        if combo.get("ctx") == "0":
            ends[0] = starts[0]
        elif ends[0] == starts[0] and "ctx" in combo:
            ends[0] = min(starts[0] + 1, keys)
        if max(e - s for s, e in zip(starts, ends)) < 2:
            starts, ends, keys = starts + [0], ends + [2], max(keys, 2)
        out = IndexerLogitsCase(mode="prefill", topk=1, keys=keys, row_starts=tuple(starts), row_ends=tuple(ends),
                                **common)
    else:
        bs = int(geometry[2:].split("-")[0])
        layout = "shuffle" if geometry.endswith("-shuffle") else "normal"
        shape = combo.get("shape", "single")
        next_n, per_row = {"single": (1, False), "mtp": (2, False), "mtp-per-row": (2, True)}[shape]
        first = {"0": 0, "page-1": bs - 1, "page": bs, "page+1": bs + 1}[combo.get("ctx", "page")]
        ctx = [first, bs + 2]  # a second request keeps a row at least two long (top-k below it exists)
        if per_row:
            ctx = [max(c - next_n + j + 1, 0) for c in ctx for j in range(next_n)]
        out = IndexerLogitsCase(mode="decode", topk=1, next_n=next_n, block_size=bs, layout=layout,
                                context_lens=tuple(ctx), per_row=per_row, max_model_len=1 << 20,
                                extra_columns=case.extra_columns if case.mode == "decode" else 1,
                                spare_blocks=case.spare_blocks,
                                cache_view=("flat" if combo["view"] == "flat" else "padded-rows") if "view" in combo
                                else case.cache_view if case.mode == "decode" else "flat",
                                ctx_count="exact" if next_n < 2 else combo.get(
                                    "ctx_count", case.ctx_count if case.mode == "decode" else "exact"),
                                **common)
        out = out.replace(max_model_len=_longest(out) + 1)
    longest = _longest(out)
    return out.replace(topk={"below": longest - 1, "equal": longest, "above": longest + 2}[topk_cls])


def _logits_allowed(c: dict, target) -> bool:
    g = c.get("geometry")
    if g == "prefill" and (c.get("shape", "single") != "single" or c.get("ctx", "0") != "0"
                           or c.get("view", "flat") != "flat" or c.get("ctx_count", "exact") != "exact"):
        return False
    if c.get("shape") == "single" and c.get("ctx_count") == "long":  # needs next_n >= 2
        return False
    v = c.get("view", "flat")
    if g is not None and v != "flat" and (v == "padded-bs1") != (g == "bs1"):
        return False
    if g == "bs1" and c.get("ctx") == "page-1":  # the same length as "0"
        return False
    return True


def _declare_logits():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "indexer-logits",
        (Dimension("geometry", LOGITS_GEOMETRIES, "paged block size and layout, or the prefill's gathered keys"),
         Dimension("shape", LOGITS_SHAPES, "one query row per request, MTP rows, MTP rows with per-row lengths"),
         Dimension("ctx", LOGITS_CTX, "the first request's length around its page"),
         Dimension("topk", LOGITS_TOPK, "top-k against the longest visible row"),
         Dimension("values", LOGITS_VALUES, "N(0, 1) codes, a coarse grid (exact ties), every finite code, or "
                                             "signed exact zeros at the top-k cut"),
         Dimension("poison", LOGITS_POISON, "a NaN code in q or a key, a key scale inf / NaN / negative"),
         Dimension("view", LOGITS_VIEWS, "the cache as given, or a view whose token rows are not 132 bytes apart"),
         Dimension("ctx_count", LOGITS_CTX_COUNTS, "context_lens with one entry per request, or (next_n 2) the "
                   "per-row lengths flattened to 1-D, longer than q's requests (refused)"),
         Dimension("q_layout", Q_LAYOUTS, "q packed, head slots padded, heads outermost, lanes strided"),
         Dimension("weights_layout", WEIGHTS_LAYOUTS, "weights packed, a slice of a wider table, column-major")),
        (("geometry", "ctx"), ("topk", "values"), ("poison", "values"), ("shape", "ctx_count"),
         ("q_layout", "poison"), ("weights_layout", "values")),
        classify_logits, force_logits, _logits_allowed), "indexer-logits-agreement")


LOGITS_DIMENSIONS = _declare_logits()
