"""Strategies and builders for graph capture and replay of the sparse decode.

A case is one capture followed by a few replays at other row lengths; the replays always include one where every
row is empty and one where every row is at its maximum (``max_per_row``) with the source exactly the graph's
capacity, and may use fewer rows than captured. Sources may be wider than their NNZ (``slack`` entries past
``indptr[-1]`` that point at poisoned slots: a read past indptr shows up). The caches are built once per case and
kept (a graph reads them at their captured addresses); every replay draws new q, indices and indptr.

A case is a :class:`GraphCase` holding :class:`GraphStep` s (``to_json`` / ``from_json``); every tensor is made from
the case's ``seed``. Shapes stay tiny: the kernels run under the Triton interpreter here (batch <= 3, heads <= 3,
<= 8 entries per row).
"""
from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case
from fuzz.decode import (CACHE_LAYOUTS, INDEX_LAYOUTS, INT32_MAX, INT32_MIN, POISON_NOPE, POISON_ROPE_BITS,
                         POISON_SCALE, Q_LAYOUTS, SINK_LAYOUTS, laid_out_1d)
from impl import formats
from impl.runtime import kernel_device
from impl.targets import Target

BLOCK_SIZES = (1, 2, 5, 61)
SCALES = (0.0625, 0.11, 0.3)
SinkKind = Literal["none", "-inf", "ordinary", "large"]
SINK_KINDS: tuple[str, ...] = typing.get_args(SinkKind)
#: poisoned slots at the end of each cache view: sources' entries past the NNZ point at them
POISONED_SLOTS = 2
#: poisoned blocks past each view (out-of-range slots would land there if a bound check were lost)
TAIL_BLOCKS = 1


@dataclass(frozen=True)
class GraphStep(Case):
    """One step of a graph case (the capture or a replay): ``rows`` query rows with ``main_lens`` / ``extra_lens``
    entries each (``extra_lens`` None: an SWA-only layer), and ``main_slack`` / ``extra_slack`` entries past each
    source's NNZ that point at poisoned slots."""

    KIND = "graph-step"
    rows: int
    main_lens: tuple[int, ...]
    extra_lens: tuple[int, ...] | None
    main_slack: int = 0
    extra_slack: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.rows < 1:
            raise ValueError(f"rows: expected an int >= 1, got {self.rows!r}")
        for name in ("main_lens", "extra_lens"):
            lens = getattr(self, name)
            if lens is not None and (len(lens) != self.rows or any(n < 0 for n in lens)):
                raise ValueError(f"{name}: expected {self.rows} lengths >= 0, got {list(lens)}")
        for name in ("main_slack", "extra_slack"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {getattr(self, name)!r}")
        if self.extra_lens is None and self.extra_slack:
            raise ValueError("extra_slack: an SWA-only step has no extra source")


@dataclass(frozen=True)
class GraphCase(Case):
    """One capture at ``capture``'s row lengths, then ``replays`` at others, of a decode layer with
    ``compress_ratio`` (0 or 1: SWA only, ``max_extra`` None), ``batch`` rows of ``heads`` heads, at most
    ``max_main`` / ``max_extra`` entries per row (the graph buffers' capacity), caches of ``main_bs`` / ``extra_bs``
    tokens per block (``padded``: strides wider than a block), a sink of kind ``sink``, q heads-major in memory when
    ``q_transposed``, ``cu_count`` CUs; each entry invalid with probability ``invalid_rate``.
    Memory layouts (issue 30; fuzz.decode's, the values the same in each): ``q_layout`` of every step's q (None:
    ``q_transposed`` says, values drawn as before), ``cache_layout`` of both caches (None: ``padded`` says),
    ``index_layout`` of every step's indices and indptr, ``sink_layout``."""

    KIND = "graph-replay"
    ADDED_FIELDS = ("q_layout", "cache_layout", "index_layout", "sink_layout")
    seed: int
    batch: int
    heads: int
    compress_ratio: int
    max_main: int
    max_extra: int | None
    main_bs: int
    extra_bs: int
    padded: bool
    invalid_rate: float
    scale: float
    sink: SinkKind
    q_transposed: bool
    cu_count: int
    capture: GraphStep
    replays: tuple[GraphStep, ...]
    q_layout: str | None = None
    cache_layout: str | None = None
    index_layout: str = "contiguous"
    sink_layout: str = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        for name, allowed in (("q_layout", Q_LAYOUTS + (None,)), ("cache_layout", CACHE_LAYOUTS + (None,)),
                              ("index_layout", INDEX_LAYOUTS), ("sink_layout", SINK_LAYOUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(self, name)!r}")
        for name in ("batch", "heads", "max_main", "main_bs", "extra_bs", "cu_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {getattr(self, name)!r}")
        if self.compress_ratio not in (0, 1, 4, 128):
            raise ValueError(f"compress_ratio: expected 0, 1, 4 or 128, got {self.compress_ratio!r}")
        swa_only = self.compress_ratio in (0, 1)
        if swa_only != (self.max_extra is None):
            raise ValueError(f"max_extra: None exactly when the layer is SWA only (compress_ratio 0 or 1), got "
                             f"{self.max_extra!r} with compress_ratio {self.compress_ratio}")
        if self.max_extra is not None and self.max_extra < 1:
            raise ValueError(f"max_extra: expected None or an int >= 1, got {self.max_extra!r}")
        if not 0.0 <= self.invalid_rate < 1.0:
            raise ValueError(f"invalid_rate: expected a probability in [0, 1), got {self.invalid_rate!r}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"scale: expected a finite scale > 0, got {self.scale!r}")
        if self.capture.rows != self.batch:
            raise ValueError(f"capture.rows: the capture fixes the batch, expected {self.batch}, got "
                             f"{self.capture.rows}")
        for i, step in enumerate(self.replays):
            if step.rows > self.batch:
                raise ValueError(f"replays[{i}].rows: at most the captured batch {self.batch}, got {step.rows}")
        for i, step in enumerate((self.capture,) + tuple(self.replays)):
            name = "capture" if i == 0 else f"replays[{i - 1}]"
            if (step.extra_lens is None) != swa_only:
                raise ValueError(f"{name}.extra_lens: expected {'None' if swa_only else 'lengths'} for "
                                 f"compress_ratio {self.compress_ratio}")


def _step(draw, rows: int, max_main: int, max_extra: int | None, capacity_main: int, capacity_extra: int,
          kind: str) -> GraphStep:
    def lens(mx):
        if kind == "zero":
            return [0] * rows
        if kind == "max":
            return [mx] * rows
        return draw(st.lists(st.one_of(st.just(0), st.just(mx), st.integers(0, mx)), min_size=rows,
                             max_size=rows))

    main = lens(max_main)
    extra = None if max_extra is None else lens(max_extra)

    def slack(ls, cap):
        room = cap - sum(ls)
        if kind == "max" or room <= 0:
            return 0
        return draw(st.one_of(st.just(0), st.just(room), st.integers(0, room)))

    return GraphStep(rows=rows, main_lens=main, extra_lens=extra, main_slack=slack(main, capacity_main),
                     extra_slack=0 if extra is None else slack(extra, capacity_extra))


@st.composite
def graph_replay_cases(draw, target: Target, *, max_batch: int = 3, max_heads: int = 3, max_row: int = 8):
    """One capture and 2-3 replays (an all-empty one, an all-maximum one, sometimes one more) for ``target``."""
    batch = draw(st.integers(1, max_batch))
    ratio = draw(st.sampled_from([0, 1, 4, 128, 128]))
    max_main = draw(st.integers(1, max_row))
    max_extra = None if ratio in (0, 1) else draw(st.integers(1, max_row))
    cap_main = batch * max_main
    cap_extra = batch * (max_extra or 0)
    capture = _step(draw, batch, max_main, max_extra, cap_main, cap_extra, "random")
    kinds = ["zero", "max"] + (["random"] if draw(st.booleans()) else [])
    kinds = draw(st.permutations(kinds))
    replays = []
    for kind in kinds:
        rows = batch if kind == "max" else draw(st.integers(1, batch))
        replays.append(_step(draw, rows, max_main, max_extra, cap_main, cap_extra, kind))
    case = GraphCase(
        seed=draw(st.integers(0, 2 ** 31 - 1)),
        batch=batch,
        heads=draw(st.integers(1, max_heads)),
        compress_ratio=ratio,
        max_main=max_main,
        max_extra=max_extra,
        main_bs=draw(st.sampled_from(BLOCK_SIZES)),
        extra_bs=draw(st.sampled_from(BLOCK_SIZES)),
        padded=draw(st.booleans()),
        invalid_rate=draw(st.sampled_from([0.0, 0.2])),
        scale=draw(st.sampled_from(SCALES)),
        sink=draw(st.sampled_from(SINK_KINDS)),
        q_transposed=draw(st.booleans()),
        cu_count=draw(st.integers(1, 8)),
        capture=capture,
        replays=tuple(replays),
    )
    # the layouts drawn after every older field (the older derandomized draws stay as they were)
    q_layout = draw(st.sampled_from(Q_LAYOUTS))
    cache_layout = draw(st.sampled_from(CACHE_LAYOUTS))
    return case.replace(q_layout=q_layout, q_transposed=q_layout == "transposed", cache_layout=cache_layout,
                        padded=cache_layout != "packed", index_layout=draw(st.sampled_from(INDEX_LAYOUTS)),
                        sink_layout=draw(st.sampled_from(SINK_LAYOUTS)))


@dataclass
class GraphCache:
    """One persistent cache: the pool (kept alive), the view handed to the decode, its slot counts."""

    pool: torch.Tensor
    view: torch.Tensor
    num_slots: int  # slots of the view
    data_slots: int  # slots [0, data_slots) hold data; the next POISONED_SLOTS are poisoned


@dataclass
class GraphCaseInputs:
    main: GraphCache
    extra: GraphCache | None
    attn_sink: torch.Tensor | None
    softmax_scale: float


@dataclass
class StepInputs:
    """One step's device data: q [rows, heads, 512] and each segment's (indices, indptr)."""

    q: torch.Tensor
    main_indices: torch.Tensor
    main_indptr: torch.Tensor
    extra_indices: torch.Tensor | None
    extra_indptr: torch.Tensor | None


def _make_graph_cache(gen: torch.Generator, flavour: str, block_size: int, padded: bool, device,
                      before: int = 0) -> GraphCache:
    """``before``: poisoned (0xFF) blocks of the pool before the view (a pool slice: an offset base)."""
    data_slots = 10
    nb = -(-(data_slots + POISONED_SLOTS) // block_size)
    pool, big = formats.allocate_fp8_ds_mla_pool(nb + TAIL_BLOCKS, block_size, padded=padded, fill=0xFF,
                                                 extra_blocks_before=before)
    n_all = (nb + TAIL_BLOCKS) * block_size
    formats.pack_fp8_ds_mla(big, list(range(n_all)),
                            torch.full((n_all, formats.DSV4_NOPE_DIM), POISON_NOPE, dtype=torch.uint8),
                            torch.full((n_all, formats.DSV4_NUM_GROUPS), POISON_SCALE, dtype=torch.uint8),
                            torch.full((n_all, formats.DSV4_ROPE_DIM), POISON_ROPE_BITS,
                                       dtype=torch.int16).view(torch.bfloat16), pad=0xFF)
    view = big[:nb]
    x = torch.randn(data_slots, formats.DSV4_NOPE_DIM, generator=gen) * 4.0
    formats.pack_fp8_ds_mla(view, list(range(data_slots)), formats.fp8_encode(x, flavour),
                            torch.randint(123, 128, (data_slots, formats.DSV4_NUM_GROUPS),
                                          generator=gen).to(torch.uint8),
                            torch.randn(data_slots, formats.DSV4_ROPE_DIM, generator=gen).to(torch.bfloat16))
    if device != "cpu":
        pool = pool.to(device)
        view = pool.as_strided(view.shape, view.stride(), view.storage_offset())
    return GraphCache(pool, view, nb * block_size, data_slots)


def build_graph_case(case: GraphCase, target: Target, device: str | None = None) -> GraphCaseInputs:
    """The persistent part of a case (caches, sink, scale), from ``case.seed``."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed)
    layout = effective_cache_layout(case)
    padded, before = layout != "packed", int(layout == "pool-slice")
    main = _make_graph_cache(gen, target.main_cache_fp8, case.main_bs, padded, device, before)
    extra = None
    if case.max_extra is not None:
        extra = _make_graph_cache(gen, target.extra_cache_fp8, case.extra_bs, padded, device, before)
    h = case.heads
    sink = None
    if case.sink == "-inf":
        sink = torch.full((h,), -math.inf)
    elif case.sink == "ordinary":
        sink = torch.randn(h, generator=gen) * 2.0
    elif case.sink == "large":
        sink = 30.0 + torch.rand(h, generator=gen) * 10.0
    if sink is not None:
        sink = laid_out_1d(sink.to(torch.float32), case.sink_layout, math.nan, device)
    return GraphCaseInputs(main, extra, sink, case.scale)


def _ragged(gen: torch.Generator, cache: GraphCache, lens: list[int], slack: int, invalid_rate: float, device,
            layout: str = "contiguous"):
    invalid = [-1, INT32_MIN, INT32_MAX, cache.num_slots, cache.num_slots + 1]
    flat, indptr = [], [0]
    for n in lens:
        for _ in range(n):
            if invalid_rate and torch.rand(1, generator=gen).item() < invalid_rate:
                flat.append(invalid[int(torch.randint(0, len(invalid), (1,), generator=gen))])
            else:
                flat.append(int(torch.randint(0, cache.data_slots, (1,), generator=gen)))
        indptr.append(len(flat))
    flat += [cache.data_slots + int(torch.randint(0, POISONED_SLOTS, (1,), generator=gen)) for _ in range(slack)]
    # elements no view reaches: a poisoned slot (indices), 0 (indptr: a read of one shows as a wrong row)
    return (laid_out_1d(torch.tensor(flat, dtype=torch.int32), layout, cache.data_slots, device),
            laid_out_1d(torch.tensor(indptr, dtype=torch.int32), layout, 0, device))


def build_step(case: GraphCase, step: GraphStep, index: int, inputs: GraphCaseInputs,
               device: str | None = None) -> StepInputs:
    """Step ``index`` (0 = the capture) of a case: q and the ragged segments, from the case's seed and the index."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed * 31 + 7 * index + 1)
    rows, h, d = step.rows, case.heads, formats.DSV4_HEAD_DIM
    if case.q_layout is None:  # cases saved before q_layout: q_transposed says, values drawn in that order
        if case.q_transposed:
            q = torch.randn(h, rows, d, generator=gen).to(torch.bfloat16).to(device).transpose(0, 1)
        else:
            q = torch.randn(rows, h, d, generator=gen).to(torch.bfloat16).to(device)
    else:
        q = _laid_out_q(torch.randn(rows, h, d, generator=gen).to(torch.bfloat16), case.q_layout, device)
    lay = case.index_layout
    mi, mp = _ragged(gen, inputs.main, list(step.main_lens), step.main_slack, case.invalid_rate, device, lay)
    ei = ep = None
    if inputs.extra is not None:
        ei, ep = _ragged(gen, inputs.extra, list(step.extra_lens), step.extra_slack, case.invalid_rate, device, lay)
    return StepInputs(q, mi, mp, ei, ep)


def _laid_out_q(v: torch.Tensor, layout: str, device) -> torch.Tensor:
    """``v [rows, h, 512]`` on ``device`` as ``layout`` (fuzz.decode.Q_LAYOUTS); lanes no view reaches NaN."""
    if layout == "contiguous":
        return v.to(device)
    if layout == "transposed":
        return v.transpose(0, 1).contiguous().to(device).transpose(0, 1)
    d = v.shape[-1]
    wide = 576 if layout == "padded" else 2 * d
    buf = torch.full((*v.shape[:2], wide), math.nan, dtype=v.dtype)
    lanes = slice(0, d) if layout == "padded" else slice(0, 2 * d, 2)
    buf[..., lanes] = v
    return buf.to(device)[..., lanes]


def effective_q_layout(case: GraphCase) -> str:
    return case.q_layout or ("transposed" if case.q_transposed else "contiguous")


def effective_cache_layout(case: GraphCase) -> str:
    return case.cache_layout or ("padded" if case.padded else "packed")


#: each layout dimension's packed value
PACKED = {"q_layout": "contiguous", "cache_layout": "packed", "index_layout": "contiguous",
          "sink_layout": "contiguous"}
#: layouts the capture may refuse (a ValueError/TypeError naming the argument, before anything is allocated): a
#: strided sink (the graph keeps it by reference and its kernels read sink + head)
MAY_REFUSE = {"sink_layout": ("strided",)}


def graph_layouts(case: GraphCase) -> dict:
    """The layout dimensions' values (a sink layout without a sink reads as packed)."""
    return {"q_layout": effective_q_layout(case), "cache_layout": effective_cache_layout(case),
            "index_layout": case.index_layout,
            "sink_layout": case.sink_layout if case.sink != "none" else "contiguous"}


def non_packed(case: GraphCase) -> dict:
    return {k: v for k, v in graph_layouts(case).items() if v != PACKED[k]}


def with_layouts(case: GraphCase, layouts: dict) -> GraphCase:
    """``case`` with these layouts (the others as they were), the legacy flags kept in step."""
    f = dict(layouts)
    if "q_layout" in f:
        f["q_transposed"] = f["q_layout"] == "transposed"
    if "cache_layout" in f:
        f["padded"] = f["cache_layout"] != "packed"
    return case.replace(**f)


def packed_except(case: GraphCase, keep: dict) -> GraphCase:
    """``case`` with every layout packed but those in ``keep``; the same values (q drawn as a packed q is)."""
    return with_layouts(case, {**PACKED, **keep})


def refusable(case: GraphCase) -> dict:
    """``{dimension: argument names}`` of the case's layouts the capture may refuse (:data:`MAY_REFUSE`)."""
    got = graph_layouts(case)
    return {"sink_layout": "attn_sink"} if got["sink_layout"] in MAY_REFUSE["sink_layout"] else {}


# --- declared dimensions (fuzz.dimensions): the pairs the ci profile reaches on purpose ---------------------------

#: the layer kinds: SWA only (compress ratio 0 or 1: no extra segment), compressed 4 and 128 (128: the ratio that
#: allows adaptive splits on gfx950)
GRAPH_RATIOS = (0, 1, 4, 128)
#: the replay sequence's shape: the all-empty replay before the all-maximum one, after it (a replay that leaves
#: the previous step's NNZ or lengths in the persistent buffers shows only in that order), or a third replay with
#: fewer rows than captured
STEP_SHAPES = ("zero-then-max", "max-then-zero", "fewer-rows")
GRAPH_BLOCKS = ("1", "odd", "even")


def _bs_class(bs: int) -> str:
    return "1" if bs == 1 else ("odd" if bs % 2 else "even")


def _is_zero(step: GraphStep) -> bool:
    return not any(step.main_lens) and not any(step.extra_lens or ())


def _is_max(case: GraphCase, step: GraphStep) -> bool:
    return (step.rows == case.batch and all(n == case.max_main for n in step.main_lens)
            and all(n == case.max_extra for n in (step.extra_lens or ())))


def classify_graph(case: GraphCase, target: Target) -> dict:
    """The dimension values a graph case hits."""
    if any(r.rows < case.batch for r in case.replays):
        steps = "fewer-rows"
    else:
        zero = next((i for i, r in enumerate(case.replays) if _is_zero(r)), None)
        full = next((i for i, r in enumerate(case.replays) if _is_max(case, r)), None)
        steps = "zero-then-max" if zero is not None and (full is None or zero < full) else "max-then-zero"
    return {"ratio": case.compress_ratio, "steps": steps, "main_bs": _bs_class(case.main_bs),
            "slack": "wide" if case.capture.main_slack or case.capture.extra_slack else "none",
            "sink": case.sink, "invalid": "none" if case.invalid_rate == 0 else "some", **graph_layouts(case)}


def force_graph(case: GraphCase, combo: dict, target: Target) -> GraphCase:
    """``case`` rewritten to hit ``combo``: the layer's ratio (an extra segment added at the case's own lengths, or
    dropped), the capture's slack, the replays of the step shape (an all-empty and an all-maximum replay in its
    order, then for ``fewer-rows`` one more at fewer rows than captured), block size, sink and invalid entries;
    sizes as drawn (a ``fewer-rows`` case of one row gets a second, empty one)."""
    import dataclasses

    ratio = combo.get("ratio", case.compress_ratio)
    shape = combo.get("steps", classify_graph(case, target)["steps"])
    batch = max(case.batch, 2) if shape == "fewer-rows" else case.batch
    max_main = case.max_main
    max_extra = None if ratio in (0, 1) else (case.max_extra or case.max_main)
    main = (list(case.capture.main_lens) + [0] * batch)[:batch]
    extra = None if max_extra is None else [min(n, max_extra) for n in
                                            (list(case.capture.extra_lens or case.capture.main_lens) + [0] * batch)[:batch]]
    wide = combo.get("slack", classify_graph(case, target)["slack"]) == "wide"
    main_slack = 0
    if wide:
        if sum(main) >= batch * max_main:
            main[-1] -= 1
        main_slack = batch * max_main - sum(main)
    capture = GraphStep(rows=batch, main_lens=tuple(main), extra_lens=None if extra is None else tuple(extra),
                        main_slack=main_slack)

    def full(rows, kind):
        n_m = max_main if kind == "max" else 0
        n_e = None if max_extra is None else (max_extra if kind == "max" else 0)
        return GraphStep(rows=rows, main_lens=(n_m,) * rows, extra_lens=None if n_e is None else (n_e,) * rows)

    replays = [full(batch, "zero"), full(batch, "max")]
    if shape == "max-then-zero":
        replays.reverse()
    elif shape == "fewer-rows":
        rows = batch - 1
        replays.append(GraphStep(rows=rows, main_lens=tuple(main[:rows]),
                                 extra_lens=None if extra is None else tuple(extra[:rows])))
    bs = case.main_bs
    if "main_bs" in combo and _bs_class(bs) != combo["main_bs"]:
        bs = {"1": 1, "odd": 5, "even": 2}[combo["main_bs"]]
    inv = combo.get("invalid")
    rate = case.invalid_rate if inv is None else (0.0 if inv == "none" else (case.invalid_rate or 0.2))
    heads = case.heads
    sink_layout = combo.get("sink_layout", case.sink_layout)
    sink = combo.get("sink", case.sink)
    if sink_layout != "contiguous":
        heads = max(heads, 2)  # head 0 reads the same element whatever the layout: a second head reads across it
        if sink == "none":
            sink = "ordinary"
    forced = dataclasses.replace(case, batch=batch, heads=heads, compress_ratio=ratio, max_extra=max_extra,
                                 main_bs=bs, invalid_rate=rate, sink=sink, capture=capture, replays=tuple(replays))
    return with_layouts(forced, {k: combo[k] for k in PACKED if k in combo})


def _graph_allowed(c: dict, target=None) -> bool:
    return not (c.get("sink") == "none" and c.get("sink_layout", "contiguous") != "contiguous")


def graph_examples(target: Target) -> list[GraphCase]:
    """Plain cases: one row of an SWA-only layer, two rows of a ratio-128 layer."""
    step = GraphStep
    base = GraphCase(seed=3, batch=1, heads=1, compress_ratio=0, max_main=2, max_extra=None, main_bs=1, extra_bs=1,
                     padded=False, invalid_rate=0.0, scale=0.11, sink="none", q_transposed=False, cu_count=1,
                     capture=step(1, (1,), None), replays=(step(1, (0,), None), step(1, (2,), None)))
    return [base, base.replace(seed=4, batch=2, compress_ratio=128, max_extra=3, main_bs=2, extra_bs=5,
                               sink="ordinary", capture=step(2, (2, 1), (3, 0), 1, 0),
                               replays=(step(2, (2, 2), (3, 3)), step(1, (0,), (0,))))]


def _declare_graph():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "graph-replay",
        (Dimension("ratio", GRAPH_RATIOS, "the layer: SWA only (0, 1), compressed 4 or 128 (the dispatch's input)"),
         Dimension("steps", STEP_SHAPES, "the replay sequence: empty before / after the maximum, fewer rows"),
         Dimension("main_bs", GRAPH_BLOCKS, "SWA cache block-size class"),
         Dimension("slack", ("none", "wide"), "the capture's sources wider than their NNZ (poisoned entries past)"),
         Dimension("sink", SINK_KINDS),
         Dimension("invalid", ("none", "some"), "invalid entries: -1, INT32 extremes, past the view"),
         Dimension("index_layout", INDEX_LAYOUTS, "every step's indices and indptr packed, a slice of a larger "
                                                  "poisoned buffer, every other element: copied into the "
                                                  "persistent buffers (indptr padded for fewer rows)"),
         Dimension("q_layout", Q_LAYOUTS, "every step's q packed, heads-major, rows padded, lanes at stride 2: "
                                          "copied into the persistent q"),
         Dimension("cache_layout", CACHE_LAYOUTS, "both caches packed, padded blocks, a padded view one block "
                                                  "into a pool: read by reference at the captured address"),
         Dimension("sink_layout", SINK_LAYOUTS, "the sink packed, a slice, stride 2 (refusable: kept by "
                                                "reference and read at sink + head)")),
        # one interacting pair: the replay sequence against the index layout (a fewer-rows replay pads a laid-out
        # indptr, an empty one copies nothing): nine rows, a few more than the contract's six cases (a captured
        # and replayed case costs 2-4 s here, up to 10 s on gfx950); every other value once, the rest of the pairs
        # (ratio x steps, say) left to the random cases
        (("steps", "index_layout"),),
        classify_graph, force_graph, _graph_allowed, graph_examples), "graph-replay-agreement")


GRAPH_DIMENSIONS = _declare_graph()
