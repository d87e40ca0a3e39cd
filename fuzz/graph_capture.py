"""Strategies and builders for graph capture and replay of the sparse decode.

A case is one capture followed by a few replays at other row lengths; the replays always include one where every
row is empty and one where every row is at its maximum (``max_per_row``) with the source exactly the graph's
capacity, and may use fewer rows than captured. Sources may be wider than their NNZ (``slack`` entries past
``indptr[-1]`` that point at poisoned slots: a read past indptr shows up). The caches are built once per case and
kept (a graph reads them at their captured addresses); every replay draws new q, indices and indptr.

Cases are plain JSON; every tensor is made from the case's ``seed``. Shapes stay tiny: the kernels run under the
Triton interpreter here (batch <= 3, heads <= 3, <= 8 entries per row).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from fuzz.decode import INT32_MAX, INT32_MIN, POISON_NOPE, POISON_ROPE_BITS, POISON_SCALE
from impl import formats
from impl.runtime import kernel_device
from impl.targets import Target

BLOCK_SIZES = (1, 2, 5, 61)
SCALES = (0.0625, 0.11, 0.3)
SINK_KINDS = ("none", "-inf", "ordinary", "large")
#: poisoned slots at the end of each cache view: sources' entries past the NNZ point at them
POISONED_SLOTS = 2
#: poisoned blocks past each view (out-of-range slots would land there if a bound check were lost)
TAIL_BLOCKS = 1


def _step(draw, rows: int, max_main: int, max_extra: int | None, capacity_main: int, capacity_extra: int,
          kind: str) -> dict:
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

    return {"rows": rows, "main_lens": main, "extra_lens": extra, "main_slack": slack(main, capacity_main),
            "extra_slack": 0 if extra is None else slack(extra, capacity_extra)}


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
    return {
        "seed": draw(st.integers(0, 2 ** 31 - 1)),
        "batch": batch,
        "heads": draw(st.integers(1, max_heads)),
        "compress_ratio": ratio,
        "max_main": max_main,
        "max_extra": max_extra,
        "main_bs": draw(st.sampled_from(BLOCK_SIZES)),
        "extra_bs": draw(st.sampled_from(BLOCK_SIZES)),
        "padded": draw(st.booleans()),
        "invalid_rate": draw(st.sampled_from([0.0, 0.2])),
        "scale": draw(st.sampled_from(SCALES)),
        "sink": draw(st.sampled_from(SINK_KINDS)),
        "q_transposed": draw(st.booleans()),
        "cu_count": draw(st.integers(1, 8)),
        "capture": capture,
        "replays": replays,
    }


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


def _make_graph_cache(gen: torch.Generator, flavour: str, block_size: int, padded: bool, device) -> GraphCache:
    data_slots = 10
    nb = -(-(data_slots + POISONED_SLOTS) // block_size)
    pool, big = formats.allocate_fp8_ds_mla_pool(nb + TAIL_BLOCKS, block_size, padded=padded, fill=0xFF)
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


def build_graph_case(case: dict, target: Target, device: str | None = None) -> GraphCaseInputs:
    """The persistent part of a case (caches, sink, scale), from ``case['seed']``."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(int(case["seed"]))
    main = _make_graph_cache(gen, target.main_cache_fp8, int(case["main_bs"]), bool(case["padded"]), device)
    extra = None
    if case["max_extra"] is not None:
        extra = _make_graph_cache(gen, target.extra_cache_fp8, int(case["extra_bs"]), bool(case["padded"]), device)
    h = int(case["heads"])
    sink = None
    kind = case["sink"]
    if kind == "-inf":
        sink = torch.full((h,), -math.inf)
    elif kind == "ordinary":
        sink = torch.randn(h, generator=gen) * 2.0
    elif kind == "large":
        sink = 30.0 + torch.rand(h, generator=gen) * 10.0
    if sink is not None:
        sink = sink.to(torch.float32).to(device)
    return GraphCaseInputs(main, extra, sink, float(case["scale"]))


def _ragged(gen: torch.Generator, cache: GraphCache, lens: list[int], slack: int, invalid_rate: float, device):
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
    return (torch.tensor(flat, dtype=torch.int32, device=device),
            torch.tensor(indptr, dtype=torch.int32, device=device))


def build_step(case: dict, step: dict, index: int, inputs: GraphCaseInputs, device: str | None = None) -> StepInputs:
    """Step ``index`` (0 = the capture) of a case: q and the ragged segments, from the case's seed and the index."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(int(case["seed"]) * 31 + 7 * index + 1)
    rows, h = int(step["rows"]), int(case["heads"])
    if case["q_transposed"]:
        q = torch.randn(h, rows, formats.DSV4_HEAD_DIM, generator=gen).to(torch.bfloat16).to(device).transpose(0, 1)
    else:
        q = torch.randn(rows, h, formats.DSV4_HEAD_DIM, generator=gen).to(torch.bfloat16).to(device)
    rate = float(case["invalid_rate"])
    mi, mp = _ragged(gen, inputs.main, step["main_lens"], int(step["main_slack"]), rate, device)
    ei = ep = None
    if inputs.extra is not None:
        ei, ep = _ragged(gen, inputs.extra, step["extra_lens"], int(step["extra_slack"]), rate, device)
    return StepInputs(q, mi, mp, ei, ep)
