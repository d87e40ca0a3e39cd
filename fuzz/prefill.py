"""Strategies and builders for the sparse prefill (SPEC section 3, seed 003).

``prefill_cases``: tiny attention cases for the Triton interpreter (sq <= 6, d = 448 + 64 or 512 + 64, bf16 or
fp16): mostly h <= 3 and k <= 12 (one BLOCK_K tile), in some cases 17 heads (a second BLOCK_H = 16 head block)
and rows of up to 40 entries (mostly three 16-token tiles, so the online softmax rescales across tiles); dense
indices with and without ``topk_length`` (lengths past k and negative ones included), ragged indices with junk
before, after and between rows, -1 / -2 / slots at and past skv / INT32 extremes, empty rows, sinks of -inf /
ordinary / large values, non-default scales, non-contiguous q, kv and out, d or nope wide output.
Every kv row no valid entry reaches is NaN - the dead rows inside [0, skv), the rows past the kv view, the padding
lanes of a padded row stride - and every entry a correct kernel must drop (past topk_length, outside indptr) points
at a dead row, so a stray read shows up as NaN in the output.

``guard_cases`` / ``guard_tensors``: OPUS-guard configurations (sq around 1024, heads, d, dtype, GPU index) and the
attribute perturbations that flip one SPEC 3 condition each (or keep eligibility); tensors are made as torch fake
tensors, so "q on the GPU" and 1024-row shapes cost no memory and need no GPU. A second GPU is named only where
the fake mode can name one (:func:`guard_gpus`).

Cases are :class:`PrefillCase`, :class:`GuardCase` and :class:`RoutingCase` (``to_json`` / ``from_json``);
builders make every tensor from the case's seed.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case, CaseError
from fuzz.decode import SinkKind, make_sink
from impl.runtime import kernel_device

INT32_MIN = -(2 ** 31)
INT32_MAX = 2 ** 31 - 1
ROPE_DIM = 64
HeadDim = Literal[512, 576]  # 448 + ROPE_DIM, 512 + ROPE_DIM
HEAD_DIMS: tuple[int, ...] = typing.get_args(HeadDim)
SCALES = (0.02, 0.0625, 0.11, 0.3)
#: the order matters: Hypothesis starts and shrinks towards the first
SINK_KINDS = ("ordinary", "mixed", "-inf", "large", "none")
#: q packed, heads-major, lanes at stride 2, or the rows of a larger q (production's q[query_start:query_end])
QLayout = Literal["contiguous", "heads_major", "strided", "row_slice"]
#: kv 2-D, [skv, 1, d], rows padded, lanes at stride 2, or padded rows three rows into a NaN pool
KVLayout = Literal["2d", "3d", "padded_rows", "strided_lanes", "pool_slice"]
Q_LAYOUTS: tuple[str, ...] = typing.get_args(QLayout)
KV_LAYOUTS: tuple[str, ...] = typing.get_args(KVLayout)
DTypeName = Literal["bfloat16", "float16"]
#: dtypes an out of another dtype than q's may have (the Triton path converts on store)
OutDTypeName = Literal["bfloat16", "float16", "float32"]
#: rows past the kv view, all NaN: an unmasked slot >= skv reads them
KV_TAIL_ROWS = 2
OUT_PAD = 8
DTYPE_NAMES: tuple[str, ...] = typing.get_args(DTypeName)
#: long rows: up to LONG_WIDTH entries, at least THREE_TILES - three BLOCK_K = 16 tiles (SPEC 3, d >= 256)
LONG_WIDTH = 40
THREE_TILES = 2 * 16 + 1
#: one more than BLOCK_H = 16 (SPEC 3's grid (sq, ceil(h / 16))): a second head block with one live head
WIDE_HEADS = 17
#: memory layouts of the index inputs (issue 30; the values the same in each, what no view reaches a dead-row slot
#: or 0): packed; "slice" (an offset into a larger table with extra columns: dense row stride > k); "strided" (dense:
#: columns at stride 2; ragged: entries at stride 2); "transposed" (dense only: column-major)
INDEX_LAYOUTS = ("contiguous", "slice", "strided", "transposed")
#: topk_length packed, a slice of a larger buffer, or every other element of one (fill: INT32_MAX, a length past k)
TOPK_LAYOUTS = ("contiguous", "slice", "strided")
#: the sink packed, a slice of a NaN buffer, or every other element of one
SINK_LAYOUTS = ("contiguous", "slice", "strided")
#: out packed, rows padded (OUT_PAD lanes more), or heads-major ([h, sq, w] memory)
OUT_LAYOUTS = ("contiguous", "padded", "heads-major")
#: absolute regimes of the logits (issue 30 item 3): as drawn; every live logit near -110 (below fp32 exp's
#: underflow near -104: only a max-shifted softmax survives it); every live kv row the same (exact ties); q all
#: signed zeros (every logit a zero, ties at 0)
LOGIT_REGIMES = ("ordinary", "underflow", "tied", "signed-zero")
UNDERFLOW_LOGIT = -110.0
UNDERFLOW_K = 4.0
#: layouts an entry point may refuse (with a ValueError/TypeError naming the argument, before any launch): a
#: strided ragged index list (its kernel walks it at stride 1) and a strided sink (read at sink + head)
MAY_REFUSE = {"index_layout": ("strided",), "sink_layout": ("strided",)}


# --- attention cases --------------------------------------------------------------------------------------------

def _rotated(lo: int, hi: int, start: int):
    """Integers in [lo, hi] whose simplest value (where Hypothesis starts and shrinks to) is ``start``: the first
    derandomized cases then have half-full rows and several kv rows rather than nothing at all."""
    n = hi - lo + 1
    return st.integers(0, n - 1).map(lambda x: lo + (start - lo + x) % n)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class PrefillCase(Case):
    """One sparse prefill: ``sq`` query rows of ``heads`` heads, head dim ``d`` (NoPE + 64 RoPE lanes), ``dtype``;
    ``skv`` kv rows (some dead: NaN) laid out as ``kv_layout``; per row ``lens`` entries, each invalid with
    probability ``invalid_rate`` (``int32_extremes``: INT32_MIN/MAX among the invalid ones). ``mode`` "dense":
    ``width`` entries per row, with ``topk_length`` when ``topk_given`` (``topk_quirks``: lengths past the width,
    always for a full first row, and negative ones), 3-D indices when ``dense_3d``; "ragged": ``indptr_offset`` junk
    entries before the first row and ``tail_junk`` after the last. A sink of kind ``sink``; q as ``q_layout``; out
    ``out_width`` wide ("nope": the NoPE lanes only), inside a wider NaN buffer when ``out_padded``, of dtype
    ``out_dtype`` (None: q's); q and kv values scaled by ``magnitude`` (small enough for an fp16 out to hold every
    output)."""

    KIND = "prefill"
    ADDED_FIELDS = ('index_layout', 'topk_layout', 'sink_layout', 'out_layout', 'logits')
    seed: int
    sq: int
    heads: int
    d: HeadDim
    skv: int
    mode: Literal["dense", "ragged"]
    width: int
    lens: tuple[int, ...]
    topk_given: bool
    topk_quirks: bool
    dense_3d: bool
    invalid_rate: float
    int32_extremes: bool
    indptr_offset: int
    tail_junk: int
    scale: float
    sink: SinkKind
    out_width: Literal["full", "nope"]
    out_padded: bool
    q_layout: QLayout
    kv_layout: KVLayout
    magnitude: float = 1.0
    dtype: DTypeName = "bfloat16"
    out_dtype: OutDTypeName | None = None
    index_layout: str = "contiguous"
    topk_layout: str = "contiguous"
    sink_layout: str = "contiguous"
    #: None: ``out_padded`` says (cases saved before out_layout)
    out_layout: str | None = None
    logits: str = "ordinary"

    def __post_init__(self):
        super().__post_init__()
        for name, allowed in (("index_layout", INDEX_LAYOUTS), ("topk_layout", TOPK_LAYOUTS),
                              ("sink_layout", SINK_LAYOUTS), ("out_layout", OUT_LAYOUTS + (None,)),
                              ("logits", LOGIT_REGIMES), ("q_layout", Q_LAYOUTS), ("kv_layout", KV_LAYOUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(self, name)!r}")
        if self.mode == "ragged" and self.index_layout == "transposed":
            raise ValueError("index_layout: ragged indices are 1-D, they have no transposed layout")
        for name in ("sq", "heads", "skv"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {getattr(self, name)!r}")
        for name in ("seed", "width", "indptr_offset", "tail_junk"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {getattr(self, name)!r}")
        if len(self.lens) != self.sq or any(n < 0 for n in self.lens):
            raise ValueError(f"lens: expected {self.sq} lengths >= 0, got {list(self.lens)}")
        if self.mode == "dense" and any(n > self.width for n in self.lens):
            raise ValueError(f"lens: a dense row holds at most width = {self.width} entries, got {list(self.lens)}")
        if not 0.0 <= self.invalid_rate < 1.0:
            raise ValueError(f"invalid_rate: expected a probability in [0, 1), got {self.invalid_rate!r}")
        for name in ("scale", "magnitude"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")


def prefill_cases(*, max_sq: int = 6, max_heads: int = 3, max_width: int = 12, max_skv: int = 20,
                  long_width: int = LONG_WIDTH, wide_heads: int = WIDE_HEADS, layouts: bool | str = True):
    """Mostly one tile and one head block; about one case in three has rows up to ``long_width`` entries (most of
    them THREE_TILES or more, some any length) over up to 2 * long_width kv rows, and about one in
    five has ``wide_heads`` heads. Each costs the interpreter a few programs more, not a bigger shape everywhere.
    ``layouts``: also draw the index, topk_length, sink and out layouts and the absolute logit regimes; "memory":
    the layouts only, the regime ordinary (the routing families: about what is routed and where it is read, not
    about the softmax's absolute regimes); False: every layout packed."""
    @st.composite
    def build(draw):
        sq = draw(_rotated(1, max_sq, 3))
        long_rows = draw(st.integers(0, 2)) == 2
        if long_rows:
            # widths of at least three tiles; row lengths mostly three tiles, some any length (one or two tiles)
            width = draw(st.integers(THREE_TILES, max(long_width, THREE_TILES)))
            row_len = st.one_of(st.integers(THREE_TILES, width), st.integers(0, width))
            skv = draw(_rotated(2, 2 * long_width, long_width))
        else:
            width = draw(_rotated(0, max_width, max_width // 2 + 1))
            row_len = _rotated(0, width, width // 2)
            skv = draw(_rotated(2, max_skv, max_skv // 2))
        wide = draw(st.integers(0, 4)) == 4
        # drawn in the order the fields are listed (the ci profile's derandomized cases depend on it)
        seed = draw(st.integers(0, 2 ** 31 - 1))
        heads = wide_heads if wide else draw(_rotated(1, max_heads, 2))
        d = draw(st.sampled_from(HEAD_DIMS))
        dtype = draw(st.sampled_from(DTYPE_NAMES + ("bfloat16",)))
        mode = draw(st.sampled_from(["dense", "ragged"]))
        # mostly rows shorter than k (entries past topk_length exist), some full, some empty
        lens = draw(st.lists(st.one_of(row_len, st.just(0)), min_size=sq, max_size=sq))
        topk_given = draw(st.integers(0, 3)) < 3
        topk_quirks = draw(st.booleans())
        if mode == "dense" and topk_given and topk_quirks and width:
            lens[0] = width  # a full first row, given a length past k (clamped to k): a read past k shows
        case = PrefillCase(
            seed=seed, sq=sq, heads=heads, d=d, dtype=dtype, skv=skv, mode=mode, width=width, lens=lens,
            topk_given=topk_given, topk_quirks=topk_quirks,
            dense_3d=draw(st.booleans()),
            invalid_rate=draw(st.sampled_from([0.2, 0.0, 0.5])),
            int32_extremes=draw(st.integers(0, 3)) == 3,
            indptr_offset=draw(st.sampled_from([2, 0, 0])),
            tail_junk=draw(_rotated(0, 3, 1)),
            scale=draw(st.sampled_from(SCALES)),
            sink=draw(st.sampled_from(SINK_KINDS)),
            out_width=draw(st.sampled_from(["full", "nope"])),
            out_padded=draw(st.booleans()),
            q_layout=draw(st.sampled_from(Q_LAYOUTS)),
            kv_layout=draw(st.sampled_from(KV_LAYOUTS)),
            magnitude=draw(st.sampled_from([1.0, 1.0, 4.0])),
            out_dtype=draw(st.sampled_from([None, None, None, "float32", "float16", "bfloat16"])),
        )
        if not layouts:
            return case
        drawn = _draw_layouts(draw, mode)
        if layouts == "memory":
            drawn["logits"] = "ordinary"
        return case.replace(**drawn)

    return build()


def _draw_layouts(draw, mode: str) -> dict:
    """The issue-30 fields, drawn after every older one (the older fields' derandomized draws stay as they were)."""
    out_layout = draw(st.sampled_from(OUT_LAYOUTS))
    return dict(index_layout=draw(st.sampled_from(INDEX_LAYOUTS if mode == "dense" else INDEX_LAYOUTS[:3])),
                topk_layout=draw(st.sampled_from(TOPK_LAYOUTS)), sink_layout=draw(st.sampled_from(SINK_LAYOUTS)),
                out_layout=out_layout, out_padded=out_layout == "padded",
                logits=draw(st.sampled_from(LOGIT_REGIMES)))


@dataclass
class PrefillInputs:
    q: torch.Tensor
    kv: torch.Tensor  # [skv, d] or [skv, 1, d], a view into kv_buffer
    kv_buffer: torch.Tensor
    indices: torch.Tensor  # dense [sq, k] / [sq, 1, k], or ragged 1-D
    topk_length: torch.Tensor | None
    indptr: torch.Tensor | None
    attn_sink: torch.Tensor | None
    softmax_scale: float
    out: torch.Tensor  # NaN-poisoned, a view into out_buffer
    out_buffer: torch.Tensor
    # the same indices as Python lists, for the oracle
    dense: list[list[int]] | None
    topk_list: list[int] | None
    ragged: list[int] | None
    indptr_list: list[int] | None
    nope: int


def _randint(gen, lo: int, hi: int) -> int:
    """Uniform in [lo, hi]."""
    return lo + int(torch.randint(0, hi - lo + 1, (1,), generator=gen))


def _coin(gen, p: float) -> bool:
    return bool(torch.rand(1, generator=gen).item() < p)


def build_prefill_inputs(case: PrefillCase, device: str | None = None) -> PrefillInputs:
    """Every tensor of a prefill case, made from ``case.seed`` on the kernel device."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed)
    sq, h, d, skv = case.sq, case.heads, case.d, case.skv
    nope = d - ROPE_DIM
    mag = case.magnitude
    dt = _DTYPES[case.dtype]
    # kv: live rows hold data, every other row (dead rows, the tail past skv, padding lanes) is NaN
    live = [_coin(gen, 0.7) for _ in range(skv)]
    live[_randint(gen, 0, skv - 1)] = False  # at least one dead row inside [0, skv)
    live_rows = [i for i in range(skv) if live[i]]
    dead_rows = [i for i in range(skv) if not live[i]]
    rows_total = skv + KV_TAIL_ROWS
    layout = case.kv_layout
    data = (torch.randn(rows_total, d, generator=gen) * mag).to(dt)
    data[[i for i in range(rows_total) if i >= skv or not live[i]]] = math.nan
    if layout == "2d":
        buf = data.clone()
        kv = buf[:skv]
    elif layout == "3d":
        buf = data.clone().reshape(rows_total, 1, d)
        kv = buf[:skv]
    elif layout == "padded_rows":
        buf = torch.full((rows_total, d + 24), math.nan, dtype=dt)
        buf[:, :d] = data
        kv = buf[:skv, :d]
    elif layout == "pool_slice":  # padded rows, KV_POOL_BEFORE NaN rows into the pool
        buf = torch.full((KV_POOL_BEFORE + rows_total, d + 24), math.nan, dtype=dt)
        buf[KV_POOL_BEFORE:, :d] = data
        kv = buf[KV_POOL_BEFORE:KV_POOL_BEFORE + skv, :d]
    else:  # strided_lanes: last-dim stride 2, the lanes in between NaN
        buf = torch.full((rows_total, 2 * d), math.nan, dtype=dt)
        buf[:, ::2] = data
        kv = buf[:skv, ::2]
    # q
    ql = case.q_layout
    if ql == "heads_major":
        q_base = (torch.randn(h, sq, d, generator=gen) * mag).to(dt)
        q = q_base.transpose(0, 1)
    elif ql == "strided":
        q_base = (torch.randn(sq, h, 2 * d, generator=gen) * mag).to(dt)
        q = q_base[..., ::2]
    elif ql == "row_slice":  # rows 2.. of a larger q, the rows around NaN
        q_base = torch.full((sq + 3, h, d), math.nan, dtype=dt)
        q_base[2:2 + sq] = (torch.randn(sq, h, d, generator=gen) * mag).to(dt)
        q = q_base[2:2 + sq]
    else:
        q_base = (torch.randn(sq, h, d, generator=gen) * mag).to(dt)
        q = q_base
    _apply_regime(case, q, kv, live_rows)
    # entries
    invalid = [-1, -2, skv, skv + 1]
    if case.int32_extremes:
        invalid += [INT32_MIN, INT32_MAX]
    rate = case.invalid_rate

    def entry() -> int:
        if not live_rows or _coin(gen, rate):
            return invalid[_randint(gen, 0, len(invalid) - 1)]
        return live_rows[_randint(gen, 0, len(live_rows) - 1)]

    def dead() -> int:
        return dead_rows[_randint(gen, 0, len(dead_rows) - 1)]

    lens = list(case.lens)
    rows = [[entry() for _ in range(n)] for n in lens]
    dense = topk_list = ragged = indptr_list = None
    topk_t = indptr_t = None
    if case.mode == "dense":
        width = case.width
        dense = []
        if case.topk_given:
            topk_list = []
            for r, row in enumerate(rows):
                tail = [dead() if _coin(gen, 0.7) else -1 for _ in range(width - len(row))]
                dense.append(row + tail)
                n = len(row)
                # (the coin is drawn first, so forcing row 0 leaves every later draw as it was)
                if case.topk_quirks and n == width and (_coin(gen, 0.5) or r == 0):
                    n = width + _randint(gen, 1, 3)  # clamped to k
                elif case.topk_quirks and n == 0 and _coin(gen, 0.5):
                    n = -_randint(gen, 1, 3)  # clamped to 0
                topk_list.append(n)
            topk_t = torch.tensor(topk_list, dtype=torch.int32 if _coin(gen, 0.5) else torch.int64)
        else:
            # without topk_length a row keeps its first count(idx >= 0) entries (SPEC 2): the tail holds exactly as
            # many entries >= 0 (dead rows) as the kept prefix holds negatives. The first row with room gets a
            # negative entry if it has none, so a read past the count meets a dead row (no draw: the rest stays)
            first = next((r for r, row in enumerate(rows) if 0 < len(row) < width), None)
            if first is not None and not any(x < 0 for x in rows[first]):
                rows[first][0] = -1
            for row in rows:
                room = width - len(row)
                for i, v in enumerate(row):
                    if v < 0 and sum(1 for x in row if x < 0) > room:
                        row[i] = skv  # an out-of-range entry >= 0 instead of a negative one
                need = sum(1 for x in row if x < 0)
                tail = [dead() for _ in range(need)] + [-1] * (room - need)
                dense.append(row + tail)
        idx = torch.tensor(dense, dtype=torch.int64).reshape(sq, width)
        idx = idx.to(torch.int32) if _coin(gen, 0.5) else idx
        idx_base, idx = lay_out_dense(idx, case.index_layout, dead_rows[0])
        if case.dense_3d:
            idx = idx.unsqueeze(1)
    else:
        off = case.indptr_offset
        ragged = [dead() for _ in range(off)]
        indptr_list = [off]
        for row in rows:
            ragged += row
            indptr_list.append(len(ragged))
        ragged += [dead() for _ in range(case.tail_junk)]
        idx = lay_out_1d(torch.tensor(ragged, dtype=torch.int32), case.index_layout, dead_rows[0])
        idx_base = idx if idx._base is None else idx._base
        indptr_t = lay_out_1d(torch.tensor(indptr_list, dtype=torch.int32), case.index_layout, 0)
    if topk_t is not None:
        topk_t = lay_out_1d(topk_t, case.topk_layout, INT32_MAX)
    # sink, padded past h
    sink = make_sink(case.sink, h + _randint(gen, 0, 2), gen) if case.sink != "none" else None
    if sink is not None:
        sink = lay_out_1d(sink, case.sink_layout, math.nan)
    # out: NaN-poisoned, a view of a NaN buffer (padded rows or heads-major memory)
    out_buf, out = _make_out(case, sq, h, d if case.out_width == "full" else nope,
                             _DTYPES[case.out_dtype] if case.out_dtype else dt)
    if device != "cpu":
        buf, kv = _on(buf, kv, device)
        out_buf, out = _on(out_buf, out, device)
        q = _on(q_base, q, device)[1]
        idx = _on(idx_base, idx, device)[1]
        topk_t, indptr_t, sink = (None if t is None else _on(t._base if t._base is not None else t, t, device)[1]
                                  for t in (topk_t, indptr_t, sink))
    return PrefillInputs(q, kv, buf, idx, topk_t, indptr_t, sink, case.scale, out,
                         out_buf, dense, topk_list, ragged, indptr_list, nope)


#: NaN rows before a pool_slice kv's first row
KV_POOL_BEFORE = 3


def effective_out_layout(case: PrefillCase) -> str:
    return case.out_layout or ("padded" if case.out_padded else "contiguous")


def _make_out(case: PrefillCase, sq: int, h: int, w: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, out): a NaN out [sq, h, w] laid out as the case says, and the buffer under it."""
    layout = effective_out_layout(case)
    if layout == "heads-major":
        buf = torch.full((h, sq, w), math.nan, dtype=dtype)
        return buf, buf.transpose(0, 1)
    pad = OUT_PAD if layout == "padded" else 0
    buf = torch.full((sq, h, w + pad), math.nan, dtype=dtype)
    return buf, buf[..., :w]


def _on(base: torch.Tensor, view: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``base`` moved to ``device`` and ``view`` re-made over it (``.to`` would pack a view with gaps)."""
    b = base.to(device)
    return b, b.as_strided(view.shape, view.stride(), view.storage_offset())


def lay_out_dense(t: torch.Tensor, layout: str, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): dense ``t [R, W]`` laid out as ``layout`` (:data:`INDEX_LAYOUTS`), every element no view
    reaches ``fill`` (a dead-row slot: a read past the view lands on NaN)."""
    R, W = t.shape
    if layout == "contiguous":
        return t, t
    if layout == "transposed":
        buf = t.t().contiguous()
        return buf, buf.t()
    if layout == "slice":  # one row before, two columns before and one after: an offset base, row stride W + 3
        buf = torch.full((R + 1, W + 3), fill, dtype=t.dtype)
        buf[1:, 2:2 + W] = t
        return buf, buf[1:, 2:2 + W]
    buf = torch.full((R, 2 * W), fill, dtype=t.dtype)
    buf[:, ::2] = t
    return buf, buf[:, ::2]


def lay_out_1d(t: torch.Tensor, layout: str, fill):
    """1-D ``t`` as ``layout``: "contiguous", "slice" (3 elements into a buffer of ``fill``, 2 after), "strided"
    (every other element); "transposed" reads as "contiguous" for a 1-D tensor. The view's ``_base`` is the
    buffer."""
    n = t.numel()
    if layout in ("contiguous", "transposed"):
        return t
    if layout == "slice":
        buf = torch.full((n + 5,), fill, dtype=t.dtype)
        buf[3:3 + n] = t
        return buf[3:3 + n]
    buf = torch.full((2 * n,), fill, dtype=t.dtype)
    buf[::2] = t
    return buf[::2]


def _apply_regime(case: PrefillCase, q: torch.Tensor, kv: torch.Tensor, live_rows: list[int]) -> None:
    """Rewrite q and the live kv rows in place for ``case.logits`` (:data:`LOGIT_REGIMES`); no generator draw, so
    every other value stays as drawn."""
    if case.logits == "ordinary" or not live_rows:
        return
    kv2 = kv.reshape(kv.shape[0], -1) if kv.dim() == 3 else kv
    live = torch.tensor(live_rows)
    if case.logits == "signed-zero":
        q.copy_(torch.where(q.float() < 0, -0.0, 0.0).to(q.dtype))
    elif case.logits == "tied":  # every live row the first live row's values
        kv2[live] = kv2[live[:1]].expand(len(live_rows), -1).clone()
    else:  # lane 0 carries the -110 logit; the other lanes 1/64 of their values
        rows = kv2[live].float() / 64
        rows[:, 0] = UNDERFLOW_K
        kv2[live] = rows.to(kv2.dtype)
        qf = q.float() / 64
        qf[..., 0] = UNDERFLOW_LOGIT / (case.scale * UNDERFLOW_K)
        q.copy_(qf.to(q.dtype))


# --- OPUS guard cases -------------------------------------------------------------------------------------------

#: perturbations of an eligible configuration; each flips one SPEC 3 condition unless noted "keeps"
Perturbation = Literal[
    "sq=1", "sq=1023", "sq=1024", "sq=1025",      # the threshold (1024 and 1025 keep)
    "q_fp32", "all_fp16",                         # all_fp16 keeps
    "kv_dtype", "out_dtype",
    "q_cpu", "kv_cpu", "kv_other_gpu", "out_cpu", "out_other_gpu", "all_cpu",
    "q_heads_major", "q_and_out_heads_major",     # both keep: out is made with q's strides
    "q_last_dim_strided", "kv_last_dim_strided", "kv_3d", "kv_row_padded",  # kv_3d and kv_row_padded keep
    "out_heads_major", "out_contiguous_of_strided_q", "out_nope_wide", "kv_narrow",
    "sink_none", "sink_padded", "sink_short", "sink_2d", "sink_bf16", "sink_fp64", "sink_cpu", "sink_other_gpu",
]
GUARD_PERTURBATIONS: tuple[str, ...] = typing.get_args(Perturbation)
#: the perturbations that put a tensor on a second GPU
SECOND_GPU_PERTURBATIONS = ("kv_other_gpu", "out_other_gpu", "sink_other_gpu")
#: why configurations naming a second GPU are left out where only one exists (the contract's doc says it too)
NO_SECOND_GPU_REASON = ("a fake CUDA tensor initialises the device it names, so on a host with one CUDA device "
                        "'cuda:1' fails with 'invalid device ordinal'")


def guard_gpus() -> tuple[str, ...]:
    """The GPUs a guard configuration may name here. Without CUDA, fake tensors are metadata only (the fake mode
    installs a no-op device guard), so two emulated GPUs cost nothing and the guard's multi-device conditions
    (kv, out or sink on another GPU) are exercised on every CPU run; with CUDA the fake mode initialises each
    device a fake tensor names, so only the devices that exist (``torch.cuda.device_count()``) are named."""
    if not torch.cuda.is_available():
        return ("cuda:0", "cuda:1")
    return tuple(f"cuda:{i}" for i in range(torch.cuda.device_count()))


def guard_perturbations() -> tuple[str, ...]:
    """The perturbations this host can build: all of them, less SECOND_GPU_PERTURBATIONS with one GPU only."""
    if len(guard_gpus()) > 1:
        return GUARD_PERTURBATIONS
    return tuple(p for p in GUARD_PERTURBATIONS if p not in SECOND_GPU_PERTURBATIONS)


def _check_guard_base(case) -> None:
    """The eligible base both guards' cases share: ``sq``, ``heads`` and ``skv`` at least 1, ``gpu`` a CUDA device."""
    for name in ("sq", "heads", "skv"):
        if getattr(case, name) < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {getattr(case, name)!r}")
    kind, _, index = case.gpu.partition(":")
    if kind != "cuda" or not index.isdigit():
        raise ValueError(f"gpu: expected a device like 'cuda:0', got {case.gpu!r}")


@dataclass(frozen=True)
class GuardCase(Case):
    """An OPUS-guard configuration: an eligible base (``sq`` rows, ``heads`` heads, head dim ``d``, ``dtype``, every
    tensor on ``gpu``, ``skv`` kv rows), checked as is, under every single perturbation and under each of
    ``combos`` (two to four perturbations at once)."""

    KIND = "opus-guard"
    sq: int
    heads: int
    d: HeadDim
    dtype: DTypeName
    gpu: str
    skv: int
    combos: tuple[tuple[Perturbation, ...], ...]

    def __post_init__(self):
        super().__post_init__()
        _check_guard_base(self)


def guard_cases():
    """:class:`GuardCase` s naming only the GPUs :func:`guard_gpus` allows here."""
    perts = guard_perturbations()
    return st.builds(
        GuardCase,
        sq=st.sampled_from([1023, 1024, 1024, 1025, 2048, 1, 8]),
        heads=st.sampled_from([1, 3, 16, 64]),
        d=st.sampled_from(HEAD_DIMS),
        dtype=st.sampled_from(DTYPE_NAMES),
        gpu=st.sampled_from(guard_gpus()),
        skv=st.sampled_from([1, 7, 4096]),
        # random combinations on top of the systematic single perturbations
        combos=st.lists(st.lists(st.sampled_from(perts), min_size=2, max_size=4, unique=True).map(tuple),
                        max_size=4).map(tuple),
    )


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           "float64": torch.float64}


def guard_tensors(case: GuardCase, perts) -> tuple:
    """(q, kv, attn_sink, out) fake tensors for a guard configuration with ``perts`` applied. A configuration
    naming a GPU this host cannot fake (:func:`guard_gpus`) is a :class:`~fuzz.cases.CaseError` saying so, before
    any tensor: the generator never draws one here, and a reproducer from a bigger host cannot be replayed on it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    p = set(perts)
    unknown = sorted(p - set(GUARD_PERTURBATIONS))
    if unknown:
        raise ValueError(f"perts: unknown perturbations {unknown}")
    gpus = guard_gpus()
    gpu = case.gpu
    others = [g for g in gpus if g != gpu]
    if gpu not in gpus or (p & set(SECOND_GPU_PERTURBATIONS) and not others):
        raise CaseError(f"gpu: this configuration needs {gpu if gpu not in gpus else 'a second GPU'}, and this "
                         f"host fakes only {', '.join(gpus)}: {NO_SECOND_GPU_REASON}")
    other = others[0] if others else gpu
    sq, h, d, skv = case.sq, case.heads, case.d, case.skv
    for s in ("sq=1", "sq=1023", "sq=1024", "sq=1025"):
        if s in p:
            sq = int(s.split("=")[1])
    dt = _DTYPES["float16" if "all_fp16" in p else case.dtype]
    q_dev = "cpu" if ("q_cpu" in p or "all_cpu" in p) else gpu
    kv_dev = "cpu" if ("kv_cpu" in p or "all_cpu" in p) else (other if "kv_other_gpu" in p else gpu)
    out_dev = "cpu" if ("out_cpu" in p or "all_cpu" in p) else (other if "out_other_gpu" in p else gpu)
    sink_dev = "cpu" if ("sink_cpu" in p or "all_cpu" in p) else (other if "sink_other_gpu" in p else gpu)
    q_dt = torch.float32 if "q_fp32" in p else dt
    kv_dt = (torch.float32 if dt != torch.float32 else torch.bfloat16) if "kv_dtype" in p else q_dt
    out_dt = (torch.bfloat16 if q_dt == torch.float16 else torch.float16) if "out_dtype" in p else q_dt
    # (fake CUDA tensors cannot be sliced with a step on a CPU-only torch: strided views come from as_strided)
    with FakeTensorMode():
        if "q_heads_major" in p or "q_and_out_heads_major" in p:
            q = torch.empty(h, sq, d, dtype=q_dt, device=q_dev).transpose(0, 1)
        elif "q_last_dim_strided" in p:
            q = torch.empty(sq, h, 2 * d, dtype=q_dt, device=q_dev).as_strided((sq, h, d), (h * 2 * d, 2 * d, 2))
        else:
            q = torch.empty(sq, h, d, dtype=q_dt, device=q_dev)
        kd = d - ROPE_DIM if "kv_narrow" in p else d
        if "kv_last_dim_strided" in p:
            kv = torch.empty(skv, 2 * kd, dtype=kv_dt, device=kv_dev).as_strided((skv, kd), (2 * kd, 2))
        elif "kv_row_padded" in p:
            kv = torch.empty(skv, kd + 32, dtype=kv_dt, device=kv_dev).as_strided((skv, kd), (kd + 32, 1))
        elif "kv_3d" in p:
            kv = torch.empty(skv, 1, kd, dtype=kv_dt, device=kv_dev)
        else:
            kv = torch.empty(skv, kd, dtype=kv_dt, device=kv_dev)
        if "out_nope_wide" in p:
            out = torch.empty(sq, h, d - ROPE_DIM, dtype=out_dt, device=out_dev)
        elif "out_heads_major" in p or "q_and_out_heads_major" in p:
            out = torch.empty(h, sq, d, dtype=out_dt, device=out_dev).transpose(0, 1)
        elif "out_contiguous_of_strided_q" in p:
            out = torch.empty(sq, h, d, dtype=out_dt, device=out_dev)
            if q.stride() == out.stride():  # make q the strided one so that the strides differ
                q = torch.empty(h, sq, d, dtype=q_dt, device=q_dev).transpose(0, 1)
        else:
            out = torch.empty(q.shape, dtype=out_dt, device=out_dev).as_strided(q.shape, q.stride()) \
                if q.stride(-1) == 1 else torch.empty(sq, h, d, dtype=out_dt, device=out_dev)
        if "sink_none" in p:
            sink = None
        else:
            s_dt = torch.bfloat16 if "sink_bf16" in p else (torch.float64 if "sink_fp64" in p else torch.float32)
            if "sink_padded" in p:
                shape = (h + 1,)
            elif "sink_short" in p:
                shape = (h - 1,)
            elif "sink_2d" in p:
                shape = (h, 1)
            else:
                shape = (h,)
            sink = torch.empty(shape, dtype=s_dt, device=sink_dev)
    return q, kv, sink, out


def tensor_attributes(target: str, q, kv, sink, out) -> dict:
    """The plain attributes the guard's truth table reads (``oracles.prefill.OPUS_CONDITIONS``)."""
    def dn(t):
        return str(t.dtype).replace("torch.", "")

    return {
        "target": target,
        "q_shape": tuple(q.shape), "kv_shape": tuple(kv.shape), "out_shape": tuple(out.shape),
        "q_dtype": dn(q), "kv_dtype": dn(kv), "out_dtype": dn(out),
        "q_device": str(q.device), "kv_device": str(kv.device), "out_device": str(out.device),
        "q_stride": tuple(q.stride()), "kv_stride": tuple(kv.stride()), "out_stride": tuple(out.stride()),
        "sink_shape": None if sink is None else tuple(sink.shape),
        "sink_dtype": None if sink is None else dn(sink),
        "sink_device": None if sink is None else str(sink.device),
    }


# --- routing cases ----------------------------------------------------------------------------------------------

FallbackScenario = Literal["guard_false", "no_op", "op_raises"]
FALLBACK_SCENARIOS: tuple[str, ...] = typing.get_args(FallbackScenario)


@dataclass(frozen=True)
class RoutingCase(Case):
    """The OPUS guard checked on ``guard``'s configurations, then the entry's routing on the tiny real ``inputs``:
    once routed to a fake OPUS op, once through the Triton fallback of ``fallback`` (guard false, no op, or the op
    reporting failure)."""

    KIND = "opus-routing"
    inputs: PrefillCase
    fallback: FallbackScenario
    guard: GuardCase


def routing_cases():
    return st.builds(
        RoutingCase,
        # the routed call hands OPUS attn_sink[:h]: the inputs always have a sink
        inputs=prefill_cases(max_sq=4, max_heads=3, max_width=10, max_skv=14, layouts="memory").map(
            lambda c: c.replace(sink="ordinary") if c.sink == "none" else c),
        fallback=st.sampled_from(FALLBACK_SCENARIOS),
        guard=guard_cases(),
    )


# --- declared dimensions (fuzz.dimensions) ----------------------------------------------------------------------

#: SPEC 3's BLOCK_K for d >= 256 (both head dims here): the tile a prefill row's entries are walked in
PREFILL_TILE = 16
#: the first row's length class around that tile
ROW_LEN_CLASSES = ("0", "1", "t-1", "t", "t+1", "2t-1", "2t", "2t+1")
#: how a row's entries come: dense with topk_length, dense counted (count(idx >= 0), SPEC 2), ragged through indptr
INDEX_MODES = ("dense-topk", "dense-count", "ragged")
INVALID_KINDS = ("none", "slots", "int32")
#: q heads: one BLOCK_H = 16 head block, or a second one with one live head
HEAD_BLOCKS = ("one", "two")


def _row_len(cls: str, tile: int = PREFILL_TILE) -> int:
    return {"0": 0, "1": 1, "t-1": tile - 1, "t": tile, "t+1": tile + 1, "2t-1": 2 * tile - 1, "2t": 2 * tile,
            "2t+1": 2 * tile + 1}[cls]


def _row_len_class(n: int, tile: int = PREFILL_TILE) -> str | None:
    return next((c for c in ROW_LEN_CLASSES if _row_len(c, tile) == n), None)


def _index_mode(case: PrefillCase) -> str:
    if case.mode == "ragged":
        return "ragged"
    return "dense-topk" if case.topk_given else "dense-count"


def _invalid_kind(case: PrefillCase) -> str:
    return "none" if case.invalid_rate == 0 else ("int32" if case.int32_extremes else "slots")


def _set_index_fields(case: PrefillCase, combo: dict) -> dict:
    """The fields of ``case`` rewritten for ``combo``'s index_mode, row_len, invalid and topk_quirks (the entry
    part shared by the prefill and the routing families)."""
    f = {x.name: getattr(case, x.name) for x in dataclasses.fields(case)}
    if "index_mode" in combo:
        m = combo["index_mode"]
        f["mode"] = "ragged" if m == "ragged" else "dense"
        f["topk_given"] = m == "dense-topk"
    lens = list(f["lens"])
    if "row_len" in combo:
        lens[0] = _row_len(combo["row_len"])
    if "first_row" in combo:
        lens[0] = {"empty": 0, "one": 1, "several": lens[0] if lens[0] >= 2 else 2 + case.seed % 3}[combo["first_row"]]
    f["lens"] = tuple(lens)
    if f["mode"] == "dense":
        f["width"] = max([f["width"], *lens])
    if "invalid" in combo:
        inv = combo["invalid"]
        f["invalid_rate"] = 0.0 if inv == "none" else (case.invalid_rate or 0.2)
        f["int32_extremes"] = inv == "int32"
    if "topk_quirks" in combo:
        f["topk_quirks"] = combo["topk_quirks"]
    if not (f["mode"] == "dense" and f["topk_given"]):
        f["topk_quirks"] = False
    elif f["topk_quirks"] and lens[0] > 0:
        # the first row full, so the builder gives it a length past k (a dense row of width k always clamps it)
        f["lens"] = (lens[0], *(min(n, lens[0]) for n in lens[1:]))
        f["width"] = lens[0]
    return f


def classify_prefill(case: PrefillCase, target=None) -> dict:
    """The dimension values a prefill case hits (the length class is its first row's; a length in no class is
    left out)."""
    out = {
        "index_mode": _index_mode(case),
        "invalid": _invalid_kind(case),
        "topk_quirks": bool(case.topk_quirks and case.mode == "dense" and case.topk_given),
        "d": case.d,
        "out_width": case.out_width,
        "dtype": case.dtype,
        "out_dtype": "same" if case.out_dtype in (None, case.dtype) else "other",
        "heads": "two" if case.heads > 16 else "one",
        "sink": case.sink,
        "kv_layout": case.kv_layout,
        "q_layout": case.q_layout,
        **_layouts(case),
    }
    cls = _row_len_class(case.lens[0])
    if cls is not None:
        out["row_len"] = cls
    return out


def _layouts(case: PrefillCase) -> dict:
    """The layout and regime dimensions' values; a layout of an argument the case does not pass reads as packed."""
    return {"index_layout": case.index_layout,
            "topk_layout": case.topk_layout if _index_mode(case) == "dense-topk" else "contiguous",
            "sink_layout": case.sink_layout if case.sink != "none" else "contiguous",
            "out_layout": effective_out_layout(case), "logits": case.logits}


#: each layout dimension's packed value
PACKED = {"q_layout": "contiguous", "kv_layout": "2d", "index_layout": "contiguous", "topk_layout": "contiguous",
          "sink_layout": "contiguous", "out_layout": "contiguous"}


def non_packed(case: PrefillCase) -> dict:
    """``{dimension: value}`` of the case's layouts that are not packed ("3d" kv is its own packed shape)."""
    got = {**_layouts(case), "q_layout": case.q_layout, "kv_layout": case.kv_layout}
    return {k: got[k] for k in PACKED if got[k] != PACKED[k] and not (k == "kv_layout" and got[k] == "3d")}


def packed_except(case: PrefillCase, keep: dict) -> PrefillCase:
    """``case`` with every layout packed but those in ``keep``; the same values."""
    f = {**PACKED, "kv_layout": "3d" if case.kv_layout == "3d" else "2d", **keep}
    return case.replace(**f, out_padded=f["out_layout"] == "padded")


def refusable(case: PrefillCase) -> dict:
    """``{dimension: argument names}`` of the case's layouts an entry point may refuse (:data:`MAY_REFUSE`): a
    strided ragged index list (indices/indptr) and a strided sink."""
    out = {}
    if case.mode == "ragged" and case.index_layout in MAY_REFUSE["index_layout"]:
        out["index_layout"] = "indices/indptr"
    if case.sink != "none" and case.sink_layout in MAY_REFUSE["sink_layout"]:
        out["sink_layout"] = "attn_sink"
    return out


def _settle_layouts(f: dict) -> None:
    """A forced case's layouts made consistent: a transposed index table on a case forced ragged becomes strided (a
    drawn dense case's layout: no 2-D layout left), and a forced out layout sets ``out_padded``."""
    if f["mode"] == "ragged" and f["index_layout"] == "transposed":
        f["index_layout"] = "strided"
    if f["out_layout"] is not None:
        f["out_padded"] = f["out_layout"] == "padded"


def force_prefill(case: PrefillCase, combo: dict, target=None) -> PrefillCase:
    """``case`` rewritten to hit ``combo``; the rest (seed, sq, other rows, skv, scale, magnitude) as drawn."""
    f = _set_index_fields(case, combo)
    for k in ("d", "out_width", "dtype", "sink", "kv_layout", "q_layout", "index_layout", "topk_layout",
              "sink_layout", "out_layout", "logits"):
        if k in combo:
            f[k] = combo[k]
    _settle_layouts(f)
    if f["sink_layout"] != "contiguous" and f["heads"] < 2:
        f["heads"] = 2  # head 0 reads the same element whatever the layout: a second head reads across it
    if "heads" in combo:
        if combo["heads"] == "two":
            f["heads"] = WIDE_HEADS
        elif f["heads"] > 16:
            f["heads"] = 1 + case.seed % 3
    if "out_dtype" in combo or "dtype" in combo:
        want = combo.get("out_dtype", "same" if f["out_dtype"] in (None, f["dtype"]) else "other")
        other = {"bfloat16": ("float32", "float16"), "float16": ("float32", "bfloat16")}[f["dtype"]]
        f["out_dtype"] = None if want == "same" else other[case.seed % 2]
    return PrefillCase(**f)


def _prefill_allowed(c: dict, target=None) -> bool:
    if c.get("topk_quirks") is True and c.get("index_mode", "dense-topk") != "dense-topk":
        return False
    if c.get("topk_quirks") is True and c.get("row_len") == "0":
        return False  # the quirks' forced row is the full first row (a length past k); an empty one has none
    if c.get("index_mode") == "ragged" and c.get("index_layout") == "transposed":
        return False  # 1-D ragged indices have no transposed layout
    if c.get("index_mode", "dense-topk") != "dense-topk" and c.get("topk_layout", "contiguous") != "contiguous":
        return False  # no topk_length, no layout of it
    if c.get("sink") == "none" and c.get("sink_layout", "contiguous") != "contiguous":
        return False  # no sink, no sink layout
    return True


def prefill_family_examples(target=None) -> list[PrefillCase]:
    base = PrefillCase(seed=1, sq=2, heads=1, d=512, skv=6, mode="dense", width=3, lens=(2, 1), topk_given=True,
                       topk_quirks=False, dense_3d=False, invalid_rate=0.0, int32_extremes=False, indptr_offset=0,
                       tail_junk=0, scale=0.0625, sink="none", out_width="full", out_padded=False,
                       q_layout="contiguous", kv_layout="2d")
    return [base, base.replace(seed=2, mode="ragged", topk_given=False, lens=(0, 3), d=576, dtype="float16"),
            base.replace(seed=3, heads=17, topk_given=False, sink="large", out_dtype="float32")]


def _declare_prefill():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "prefill",
        (Dimension("row_len", ROW_LEN_CLASSES, "first row's entry count around BLOCK_K = 16 (tiles walked, a "
                                               "partial last tile, the online-softmax rescale across tiles)"),
         Dimension("index_mode", INDEX_MODES, "the kernel's DENSE mode with topk_length or counted lengths, or "
                                              "its ragged mode through indptr"),
         Dimension("invalid", INVALID_KINDS, "invalid entries: none, -1/-2/slots at and past skv, plus INT32 "
                                             "extremes (the int64 bound compare)"),
         Dimension("topk_quirks", (True, False), "topk_length past k (clamped to k) and negative (clamped to 0); "
                                                 "first, so the array's first dense-topk row has them"),
         Dimension("d", HEAD_DIMS, "448 + 64 (one 512-lane tile) or 512 + 64 (SPLIT_D: NoPE and RoPE tiles)"),
         Dimension("out_width", ("full", "nope"), "OUT_D: d wide, or NoPE wide (the RoPE tile's store skipped)"),
         Dimension("dtype", DTYPE_NAMES, "IN_BF16: bf16 read as raw words, or fp16"),
         Dimension("out_dtype", ("same", "other"), "out of q's dtype, or another float dtype (converted on store)"),
         Dimension("heads", HEAD_BLOCKS, "one BLOCK_H head block, or a second with masked heads"),
         Dimension("sink", SINK_KINDS, "HAS_SINK and the sink's kind"),
         Dimension("kv_layout", KV_LAYOUTS, "kv 2-D, [skv, 1, d], padded rows, last-dim stride 2, padded rows "
                                            "three rows into a NaN pool"),
         Dimension("q_layout", Q_LAYOUTS, "q contiguous, heads-major, last-dim stride 2, rows of a larger q"),
         Dimension("index_layout", INDEX_LAYOUTS, "indices (and indptr) packed, a slice of a larger table (dense: "
                                                  "row stride > k), strided (ragged: refusable), column-major"),
         Dimension("topk_layout", TOPK_LAYOUTS, "topk_length packed, a slice of a larger buffer, stride 2"),
         Dimension("sink_layout", SINK_LAYOUTS, "the sink packed, a slice of a NaN buffer, stride 2 (refusable)"),
         Dimension("out_layout", OUT_LAYOUTS, "out packed, rows padded, heads-major"),
         Dimension("logits", LOGIT_REGIMES, "absolute regime: as drawn, every live logit near -110 (below fp32 "
                                            "exp's underflow), exact ties, q all signed zeros")),
        (("row_len", "index_mode"), ("index_mode", "invalid"), ("index_mode", "topk_quirks"), ("d", "out_width"),
         ("dtype", "out_dtype"), ("sink", "heads"),
         # layouts against what reads them: the index mode picks the dense (strides read) or ragged walk and
         # whether topk_length is read; the head dim's tiles (SPLIT_D) read q's and kv's lanes and store out's;
         # the regimes meet the sink (dominating or vanishing against -110) and the dtype's exp and store
         ("index_mode", "index_layout"), ("index_mode", "topk_layout"), ("sink", "sink_layout"),
         ("out_width", "out_layout"), ("d", "kv_layout"), ("d", "q_layout"), ("sink", "logits"),
         ("dtype", "logits")),
        classify_prefill, force_prefill, _prefill_allowed, prefill_family_examples), "prefill-oracle-agreement")


PREFILL_DIMENSIONS = _declare_prefill()


#: the guard base's sq against OPUS_MIN_QUERIES = 1024 (first, so the array's first rows have an eligible base on
#: gfx950: a perturbation's flip then shows)
GUARD_SQ_CLASSES = ("at", "above", "below")
FIRST_ROW_CLASSES = ("empty", "one", "several")
#: the fallback scenarios, the op reporting failure first (the array's first row runs the OPUS call and then Triton)
FALLBACK_ORDER = ("op_raises", "no_op", "guard_false")


#: the routing families' layout dimensions: every tensor input of the entry they route (the guard's fake tensors
#: vary their layouts through its perturbations instead). The routes read the dense indices and topk_length
#: through a dense->ragged conversion or pass a ragged list on as it is, hand q, kv, attn_sink[:h] and out to the
#: op as they are (the gfx942 route copies into an out AITER does not accept), and the Triton fallback reads each
#: in place; a strided ragged list or a strided sink is refused before anything is routed (MAY_REFUSE)
ROUTING_LAYOUT_DIMS = ("index_layout", "topk_layout", "out_layout", "sink_layout", "q_layout", "kv_layout")


def _routing_layout_dimensions():
    from fuzz.dimensions import Dimension

    return (Dimension("index_layout", INDEX_LAYOUTS, "indices (and indptr) packed, a slice of a larger table, "
                                                     "strided (ragged: refusable), column-major: what the "
                                                     "dense->ragged conversion reads, or the list passed on"),
            Dimension("topk_layout", TOPK_LAYOUTS, "topk_length packed, a slice, stride 2 (read by the conversion)"),
            Dimension("out_layout", OUT_LAYOUTS, "out packed, rows padded, heads-major: handed to the op, or "
                                                 "the op's result copied into it, or written by Triton"),
            Dimension("sink_layout", SINK_LAYOUTS, "the sink packed, a slice, stride 2 (refusable): attn_sink[:h] "
                                                   "handed to the op"),
            Dimension("q_layout", Q_LAYOUTS, "q as the caller laid it out, handed to the op as it is"),
            Dimension("kv_layout", KV_LAYOUTS, "kv handed to the op as [skv, d] over the caller's memory"))


def _routing_layouts(inp: PrefillCase) -> dict:
    """The layout dimensions' values of a routing case's inputs (an argument not passed reads as packed)."""
    got = {**_layouts(inp), "q_layout": inp.q_layout, "kv_layout": inp.kv_layout}
    return {k: got[k] for k in ROUTING_LAYOUT_DIMS}


def _force_routing_layouts(f: dict, combo: dict) -> None:
    """``f`` (a PrefillCase's fields, index fields already forced) laid out as ``combo`` says; a sink layout other
    than packed brings a sink (and a second head, which reads across it) where the case had neither."""
    for k in ROUTING_LAYOUT_DIMS:
        if k in combo:
            f[k] = combo[k]
    _settle_layouts(f)
    if f["sink_layout"] != "contiguous":
        if f["sink"] == "none":
            f["sink"] = "ordinary"
        f["heads"] = max(f["heads"], 2)


def _routing_layouts_allowed(c: dict) -> bool:
    if c.get("index_mode") == "ragged" and c.get("index_layout") == "transposed":
        return False  # 1-D ragged indices have no transposed layout
    if c.get("index_mode", "dense-topk") != "dense-topk" and c.get("topk_layout", "contiguous") != "contiguous":
        return False  # no topk_length, no layout of it
    if c.get("out_write") == "inplace" and c.get("out_layout", "contiguous") != "contiguous":
        return False  # AITER writes in place only into a contiguous out
    return True


def _guard_sq_class(sq: int) -> str:
    return "below" if sq < 1024 else ("at" if sq == 1024 else "above")


def classify_routing(case: RoutingCase, target=None) -> dict:
    inp = case.inputs
    n = inp.lens[0]
    return {
        "fallback": case.fallback,
        "index_mode": _index_mode(inp),
        "invalid": _invalid_kind(inp),
        "first_row": "empty" if n == 0 else ("one" if n == 1 else "several"),
        "guard_sq": _guard_sq_class(case.guard.sq),
        "guard_dtype": case.guard.dtype,
        "guard_d": case.guard.d,
        **_routing_layouts(inp),
    }


def force_routing(case: RoutingCase, combo: dict, target=None) -> RoutingCase:
    """``case`` rewritten to hit ``combo``: the fallback scenario, the inputs' index mode, invalid entries and
    first row, the guard base's sq class, dtype and head dim; the rest as drawn."""
    f = _set_index_fields(case.inputs, combo)
    _force_routing_layouts(f, combo)
    inputs = PrefillCase(**f)
    g = case.guard
    if "guard_sq" in combo:
        cls = combo["guard_sq"]
        sq = 1024 if cls == "at" else (g.sq if _guard_sq_class(g.sq) == cls else (1023 if cls == "below" else 1025))
        g = g.replace(sq=sq)
    if "guard_dtype" in combo:
        g = g.replace(dtype=combo["guard_dtype"])
    if "guard_d" in combo:
        g = g.replace(d=combo["guard_d"])
    return RoutingCase(inputs=inputs, fallback=combo.get("fallback", case.fallback), guard=g)


def routing_family_examples(target=None) -> list[RoutingCase]:
    inputs = prefill_family_examples()[0].replace(sink="ordinary")
    guard = GuardCase(sq=1024, heads=1, d=512, dtype="bfloat16", gpu="cuda:0", skv=7, combos=())
    return [RoutingCase(inputs=inputs, fallback="guard_false", guard=guard),
            RoutingCase(inputs=inputs.replace(seed=4, mode="ragged", lens=(0, 2)), fallback="no_op",
                        guard=guard.replace(sq=8, dtype="float16", d=576))]


def _declare_routing():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "opus-routing",
        (Dimension("fallback", FALLBACK_ORDER, "the Triton fallback's trigger: guard false, no op, the op "
                                               "reporting failure"),
         Dimension("index_mode", INDEX_MODES, "OPUS's ragged list from dense rows with topk_length, from counted "
                                              "dense rows, or from ragged indices as given"),
         Dimension("invalid", INVALID_KINDS, "invalid entries the OPUS list must drop: none, -1/-2/past skv, "
                                             "plus INT32 extremes"),
         Dimension("first_row", FIRST_ROW_CLASSES, "the first row empty (indptr repeats), one entry, several"),
         Dimension("guard_sq", GUARD_SQ_CLASSES, "the guard base's sq against the 1024-row threshold"),
         Dimension("guard_dtype", DTYPE_NAMES, "the guard base's dtype"),
         Dimension("guard_d", HEAD_DIMS, "the guard base's head dim"),
         *_routing_layout_dimensions()),
        (("fallback", "index_mode"), ("index_mode", "invalid"), ("index_mode", "first_row"),
         # the index mode picks the conversion (dense: strides read) or the list passed on (ragged: a strided one
         # refused); the fallback scenario picks who writes out (OPUS in place, Triton through its strides, or
         # both: OPUS's failure first). q, kv and the sink reach the op and Triton alike: each value once
         ("index_mode", "index_layout"), ("index_mode", "topk_layout"), ("fallback", "out_layout")),
        classify_routing, force_routing, lambda c, t=None: _routing_layouts_allowed(c), routing_family_examples),
        "opus-routing-guard")


ROUTING_DIMENSIONS = _declare_routing()


# --- the gfx942 AITER pa_prefill_sparse route (SPEC 10) ----------------------------------------------------------

#: SPEC 10's query-row threshold for the gfx942 route; the classes below are drawn around it
AITER_PA_MIN_QUERIES = 512
#: perturbations of a configuration for the gfx942 route's guard; each flips one SPEC 10 condition unless noted
#: "keeps" (the guard asks nothing of devices, layouts, head dims or sinks, so those keep)
AiterGuardPerturbation = Literal[
    "sq=1", "sq=511", "sq=512", "sq=513",          # the threshold (512 and 513 keep)
    "q_fp32", "all_fp32", "all_fp16", "kv_dtype",   # q_fp32 breaks both dtype conditions; all_fp16 keeps
    "q_cpu", "all_cpu", "kv_3d", "q_heads_major", "kv_narrow", "kv_last_dim_strided",  # all keep
]
AITER_GUARD_PERTURBATIONS: tuple[str, ...] = typing.get_args(AiterGuardPerturbation)


@dataclass(frozen=True)
class AiterGuardCase(Case):
    """A configuration of the gfx942 route's guard: ``sq`` rows, ``heads`` heads, head dim ``d``, ``dtype``, q and
    kv on ``gpu``, ``skv`` kv rows; checked as is, under every single perturbation and under each of ``combos``."""

    KIND = "aiter-pa-guard"
    sq: int
    heads: int
    d: HeadDim
    dtype: DTypeName
    gpu: str
    skv: int
    combos: tuple[tuple[AiterGuardPerturbation, ...], ...]

    def __post_init__(self):
        super().__post_init__()
        _check_guard_base(self)


def aiter_guard_cases():
    return st.builds(
        AiterGuardCase,
        sq=st.sampled_from([512, 511, 513, 1024, 1, 8]),
        heads=st.sampled_from([1, 2, 16, 64]),
        d=st.sampled_from(HEAD_DIMS),
        dtype=st.sampled_from(DTYPE_NAMES),
        gpu=st.just("cuda:0"),
        skv=st.sampled_from([1, 7, 4096]),
        combos=st.lists(st.lists(st.sampled_from(AITER_GUARD_PERTURBATIONS), min_size=2, max_size=4,
                                 unique=True).map(tuple), max_size=3).map(tuple),
    )


def aiter_guard_tensors(case: AiterGuardCase, perts) -> tuple:
    """(q, kv) fake tensors (metadata only: 512-row shapes and "GPU" tensors cost nothing) for a configuration of
    the gfx942 route's guard with ``perts`` applied."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    p = set(perts)
    unknown = sorted(p - set(AITER_GUARD_PERTURBATIONS))
    if unknown:
        raise ValueError(f"perts: unknown perturbations {unknown}")
    if case.gpu not in guard_gpus():
        raise CaseError(f"gpu: this configuration needs {case.gpu}, and this host fakes only "
                        f"{', '.join(guard_gpus())}")
    sq, h, d, skv = case.sq, case.heads, case.d, case.skv
    for s in ("sq=1", "sq=511", "sq=512", "sq=513"):
        if s in p:
            sq = int(s.split("=")[1])
    base = _DTYPES[case.dtype]
    if "all_fp16" in p:
        base = torch.float16
    if "all_fp32" in p:
        base = torch.float32
    q_dt = torch.float32 if "q_fp32" in p else base
    kv_dt = base
    if "kv_dtype" in p:
        kv_dt = torch.float16 if q_dt == torch.bfloat16 else torch.bfloat16
    q_dev = "cpu" if ("q_cpu" in p or "all_cpu" in p) else case.gpu
    kv_dev = "cpu" if "all_cpu" in p else case.gpu
    kd = d - ROPE_DIM if "kv_narrow" in p else d
    with FakeTensorMode():
        if "q_heads_major" in p:
            q = torch.empty(h, sq, d, dtype=q_dt, device=q_dev).transpose(0, 1)
        else:
            q = torch.empty(sq, h, d, dtype=q_dt, device=q_dev)
        if "kv_last_dim_strided" in p:
            kv = torch.empty(skv, 2 * kd, dtype=kv_dt, device=kv_dev).as_strided((skv, kd), (2 * kd, 2))
        elif "kv_3d" in p:
            kv = torch.empty(skv, 1, kd, dtype=kv_dt, device=kv_dev)
        else:
            kv = torch.empty(skv, kd, dtype=kv_dt, device=kv_dev)
    return q, kv


def aiter_guard_attributes(target: str, q, kv) -> dict:
    """The plain attributes the gfx942 route's truth table reads (``oracles.prefill.AITER_PA_CONDITIONS``)."""
    return {"target": target, "q_shape": tuple(q.shape), "q_dtype": dtype_name(q.dtype),
            "kv_dtype": dtype_name(kv.dtype), "kv_shape": tuple(kv.shape), "q_device": str(q.device)}


@dataclass(frozen=True)
class AiterRoutingCase(Case):
    """The gfx942 route's guard checked on ``guard``'s configurations, then the entry's routing on the tiny real
    ``inputs`` (routed to a fake op with the guard faked true; not routed, with the real guard, which tiny inputs
    fail); with ``large`` also a real routed call on ``large_inputs(inputs)`` (sq >= 512, the real guard)."""

    KIND = "aiter-pa-routing"
    inputs: PrefillCase
    guard: AiterGuardCase
    large: bool = False


#: what the op fails with in an ``AiterFallbackCase``: absent (``no_op``), or raising what AITER's published
#: ``pa_prefill_sparse`` builds raise for a configuration they cannot serve
AiterFailure = Literal["no_op", "RuntimeError", "AssertionError", "TypeError", "NotImplementedError"]
AITER_FAILURES: tuple[str, ...] = typing.get_args(AiterFailure)


@dataclass(frozen=True)
class AiterFallbackCase(Case):
    """The gfx942 route taken (guard faked true) on the tiny real ``inputs`` while the op is missing or fails as
    ``failure`` says: the Triton kernel must answer."""

    KIND = "aiter-pa-fallback"
    inputs: PrefillCase
    failure: AiterFailure


def large_inputs(case: PrefillCase) -> PrefillCase:
    """``case`` grown to 512-514 query rows (its rows' lengths repeated), everything else as drawn: the real guard
    routes it on gfx942."""
    sq = AITER_PA_MIN_QUERIES + case.seed % 3
    return case.replace(sq=sq, lens=tuple(case.lens[i % len(case.lens)] for i in range(sq)))


def _aiter_inputs():
    # tiny: 1-2 heads (a second head block is not the route's business), the sink may be absent (the op gets None)
    return prefill_cases(max_sq=4, max_heads=2, max_width=10, max_skv=14, wide_heads=2, layouts="memory")


def _has_route(target) -> bool:
    from impl.targets import get_target

    return target is not None and get_target(target).aiter_pa_prefill_sparse_min_queries is not None


def aiter_routing_cases(target=None):
    """Large inputs (sq >= 512) only where the route exists (gfx942): elsewhere the real guard is false and the
    Triton kernel would run 512 rows under the interpreter for nothing the guard's truth table does not show."""
    return st.builds(AiterRoutingCase, inputs=_aiter_inputs(), guard=aiter_guard_cases(),
                     large=st.booleans() if _has_route(target) else st.just(False))


def aiter_fallback_cases(target=None):
    return st.builds(AiterFallbackCase, inputs=_aiter_inputs(), failure=st.sampled_from(AITER_FAILURES))


#: how the routed result reaches ``out``: written in place (a contiguous [sq, h, d] out of q's dtype), or copied
OUT_WRITES = ("inplace", "copied")
#: the guard base's sq against the 512-row threshold
AITER_GUARD_SQ_CLASSES = ("at", "above", "below")


def _out_write(case: PrefillCase) -> str:
    same = case.out_dtype in (None, case.dtype)
    packed = effective_out_layout(case) == "contiguous"
    return "inplace" if case.out_width == "full" and packed and same else "copied"


def _force_out_write(f: dict, want: str, seed: int, layout: str | None = None) -> None:
    """``f`` rewritten so its out is written as ``want`` says; ``layout``: an out layout the combo forced (kept)."""
    if want == "inplace":
        f.update(out_width="full", out_padded=False, out_dtype=None)
        if f["out_layout"] is not None:
            f["out_layout"] = "contiguous"
    elif _out_write(PrefillCase(**f)) == "inplace":
        # a copied result: nope wide, or full width but not contiguous (padded: AITER's out must be contiguous),
        # or of another dtype
        which = seed % 3
        if which == 0:
            f["out_width"] = "nope"
        elif which == 1 and layout is None:
            f["out_padded"] = True
            if f["out_layout"] is not None:
                f["out_layout"] = "padded"
        else:
            f["out_dtype"] = "float32"


def _aiter_guard_sq_class(sq: int) -> str:
    return "below" if sq < AITER_PA_MIN_QUERIES else ("at" if sq == AITER_PA_MIN_QUERIES else "above")


def classify_aiter_routing(case: AiterRoutingCase, target=None) -> dict:
    inp = case.inputs
    n = inp.lens[0]
    return {
        "index_mode": _index_mode(inp),
        "invalid": _invalid_kind(inp),
        "first_row": "empty" if n == 0 else ("one" if n == 1 else "several"),
        "large": case.large,
        "out_write": _out_write(inp),
        "guard_sq": _aiter_guard_sq_class(case.guard.sq),
        "guard_dtype": case.guard.dtype,
        **_routing_layouts(inp),
    }


def force_aiter_routing(case: AiterRoutingCase, combo: dict, target=None) -> AiterRoutingCase:
    f = _set_index_fields(case.inputs, combo)
    _force_routing_layouts(f, combo)
    if "out_write" in combo:
        _force_out_write(f, combo["out_write"], case.inputs.seed, combo.get("out_layout"))
    g = case.guard
    if "guard_sq" in combo:
        cls = combo["guard_sq"]
        sq = g.sq if _aiter_guard_sq_class(g.sq) == cls else {"at": 512, "above": 513, "below": 511}[cls]
        g = g.replace(sq=sq)
    if "guard_dtype" in combo:
        g = g.replace(dtype=combo["guard_dtype"])
    return AiterRoutingCase(inputs=PrefillCase(**f), guard=g, large=combo.get("large", case.large))


def _aiter_routing_allowed(c: dict, target=None) -> bool:
    return not (c.get("large") is True and not _has_route(target)) and _routing_layouts_allowed(c)


def aiter_routing_family_examples(target=None) -> list[AiterRoutingCase]:
    inputs = prefill_family_examples()[0]
    guard = AiterGuardCase(sq=512, heads=1, d=512, dtype="bfloat16", gpu="cuda:0", skv=7, combos=())
    return [AiterRoutingCase(inputs=inputs, guard=guard, large=False),
            AiterRoutingCase(inputs=inputs.replace(seed=4, mode="ragged", lens=(0, 2)),
                             guard=guard.replace(sq=511, dtype="float16", d=576), large=_has_route(target))]


def _declare_aiter_routing():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "aiter-pa-routing",
        (Dimension("index_mode", INDEX_MODES, "the op's rows from dense rows with topk_length, from counted dense "
                                              "rows (both converted), or a caller's ragged list (passed through)"),
         Dimension("invalid", INVALID_KINDS, "invalid entries a converted dense row drops and a ragged row keeps"),
         Dimension("first_row", FIRST_ROW_CLASSES, "the first row empty (indptr repeats), one entry, several"),
         Dimension("large", (True, False), "a real routed call of 512-514 rows through the real guard (gfx942)"),
         Dimension("out_write", OUT_WRITES, "the op writes out in place, or its result is copied into a nope-wide, "
                                            "padded or other-dtype out"),
         Dimension("guard_sq", AITER_GUARD_SQ_CLASSES, "the guard base's sq against the 512-row threshold"),
         Dimension("guard_dtype", DTYPE_NAMES, "the guard base's dtype"),
         *_routing_layout_dimensions()),
        (("index_mode", "invalid"), ("index_mode", "first_row"), ("index_mode", "large"),
         ("index_mode", "out_write"),
         # the index mode picks the conversion (dense) or the list passed on (ragged); out's layout decides, with
         # its width and dtype, whether AITER writes it in place or its result is copied in
         ("index_mode", "index_layout"), ("index_mode", "topk_layout"), ("out_write", "out_layout")),
        classify_aiter_routing, force_aiter_routing, _aiter_routing_allowed, aiter_routing_family_examples),
        "aiter-prefill-routing")


AITER_ROUTING_DIMENSIONS = _declare_aiter_routing()


def classify_aiter_fallback(case: AiterFallbackCase, target=None) -> dict:
    return {"failure": case.failure, "index_mode": _index_mode(case.inputs), "out_write": _out_write(case.inputs),
            **_routing_layouts(case.inputs)}


def force_aiter_fallback(case: AiterFallbackCase, combo: dict, target=None) -> AiterFallbackCase:
    f = _set_index_fields(case.inputs, combo)
    _force_routing_layouts(f, combo)
    if "out_write" in combo:
        _force_out_write(f, combo["out_write"], case.inputs.seed, combo.get("out_layout"))
    return AiterFallbackCase(inputs=PrefillCase(**f), failure=combo.get("failure", case.failure))


def aiter_fallback_family_examples(target=None) -> list[AiterFallbackCase]:
    inputs = prefill_family_examples()[0]
    return [AiterFallbackCase(inputs=inputs, failure="RuntimeError"),
            AiterFallbackCase(inputs=inputs.replace(seed=4, mode="ragged", lens=(0, 2)), failure="no_op")]


def _declare_aiter_fallback():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "aiter-pa-fallback",
        (Dimension("failure", AITER_FAILURES, "the op absent, or raising what AITER's builds raise for what they "
                                              "cannot serve"),
         Dimension("index_mode", INDEX_MODES, "dense rows with topk_length, counted dense rows, ragged"),
         Dimension("out_write", OUT_WRITES, "the failing op was handed out (and may have written it) or not"),
         *_routing_layout_dimensions()),
        (("failure", "index_mode"), ("failure", "out_write"),
         # the conversion reads the dense layouts before the op fails; out's layout decides whether the failing op
         # was handed it, and Triton then writes it through its strides
         ("index_mode", "index_layout"), ("index_mode", "topk_layout"), ("out_write", "out_layout")),
        classify_aiter_fallback, force_aiter_fallback, lambda c, t=None: _routing_layouts_allowed(c),
        aiter_fallback_family_examples),
        "aiter-prefill-fallback")


AITER_FALLBACK_DIMENSIONS = _declare_aiter_fallback()
