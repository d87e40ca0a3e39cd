"""Malformed-input cases for ``bad-input-refusal``: a valid call of an entry point, drawn by that entry's own
generator (the writer, compressor, decode, prefill, gather, logits, ragged, epilogue, router, graph-buffer, layout
and codec generators of this package), with exactly one argument broken at a time.

An entry point (:class:`Entry`) names its subject function (``family.function``), the case type and strategy of its
valid calls (and which drawn calls are valid ones), an optional plain valid case, a builder that turns a valid case into the call's keyword arguments, and an
:class:`Arg` per argument it validates: the dimensions whose size is fixed by the other arguments (a cache's
``num_blocks`` is free, its record width is not), whether contiguity is required, a dtype it must refuse, and the
ids it holds that have a valid range (slots, requests, table entries), each broken on exactly the tokens that use
them. Breakages (:data:`BREAKAGES`): a fixed dimension one too small (a narrowed view of the valid tensor, so its
strides stay those of the valid one) or one too large, a wrong dtype, a wrong device (``meta``), a non-contiguous
view where contiguity is required, an id one past its range (``range-high``) or one below it (``range-low``: below
the skip value where only -1 skips, or negative where no entry may skip), an output that shares exactly one element
with an input (``overlap-tail``: its first element is the input's last; ``overlap-head``: its last is the input's
first). A count or a size passed as a number (``num_reqs``, ``block_size``, ``kv_lora_rank``) takes ``dtype`` (a
float or an int in its place) and range breakages (negative, zero, one past; a two-stage compressor's ``splits``:
zero and 32). The contract calls the broken case and
expects a ``ValueError`` / ``TypeError`` naming the argument before any launch, every buffer untouched.

An entry may be a method (``family.Class.method``): its builder puts the instance (a metadata builder after or
before ``build``, a captured graph) among the keywords as ``self``, and the instance's tensors count among the
buffers that must stay unchanged. An entry whose arguments come packed (``CommonMetadata``, ``DecodeWorkspace``)
takes them flat, each broken alone, and its ``call`` packs them with the subject's own class.

A case is one entry point's valid call; its check runs every breakage of every argument of that entry in turn
(each on a fresh copy of the call, or on another valid call drawn from the case's seed where this one cannot carry
it: no token that writes, an optional argument not passed). Declared dimension: ``entry``, so ``ci``'s covering
rows reach every entry point, and with it every argument x breakage pair.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from hypothesis import strategies as st

from fuzz import cache_writers as fcw
from fuzz import cp_gather as fcg
from fuzz import decode as fdec
from fuzz import decode_reduce as fdr
from fuzz import dsv4_step as fds
from fuzz import epilogues as fep
from fuzz import graph_buffers as fgb
from fuzz import graph_capture as fgc
from fuzz import indexer_logits as fil
from fuzz import indexer_writer as fiw
from fuzz import prefill as fpre
from fuzz import prefill_assembly as fpa
from fuzz import ragged as frg
from fuzz import router as frt
from fuzz import sparse_metadata as fsm
from fuzz.cases import Case, _freeze
from fuzz.dimensions import Dimension, Family, declare
from fuzz.formats import Fp8Case, LayoutCase, Ue8m0Case, fp8_cases, layout_cases, ue8m0_cases
from impl.runtime import kernel_device

DIM_BREAKAGES = tuple(f"dim{d}-{s}" for d in range(4) for s in ("small", "large"))
RANGE_BREAKAGES = ("range-high", "range-low")
#: an output that shares exactly one element with an input: its first element is the input's last (``tail``), or
#: its last element is the input's first (``head``)
OVERLAP_BREAKAGES = ("overlap-tail", "overlap-head")
#: ``padded``: the same values in a view whose rows (last dimension) lie one element further apart than their
#: width, each row itself packed (a cache whose tokens are not back to back)
BREAKAGES = DIM_BREAKAGES + ("dtype", "device", "noncontig", "padded") + RANGE_BREAKAGES + OVERLAP_BREAKAGES
#: breakages that make a well-typed call with corrupt ids (the rest misuse the signature)
ID_BREAKAGES = frozenset(RANGE_BREAKAGES)


@dataclass(frozen=True)
class BadInputCase(Case):
    """Malformed calls of one entry point: its valid call ``inner`` (the case its generator drew, as JSON; None:
    found from ``seed``) with, in turn, each checked argument broken by each breakage it takes (``arg`` /
    ``breakage`` given: only those); ``seed`` picks the token a range breakage hits and the valid call of a breakage
    ``inner`` cannot carry."""

    KIND: ClassVar[str] = "bad-input"

    entry: str
    inner: Any = None
    seed: int = 0
    arg: str | None = None
    breakage: str | None = None

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "inner", _freeze(self.inner))  # JSON lists as tuples, as a drawn case holds them
        if self.entry not in ENTRIES:
            raise ValueError(f"entry: unknown entry point {self.entry!r}")
        if self.arg is not None and self.arg not in ENTRIES[self.entry].args:
            raise ValueError(f"arg: {self.entry} has no checked argument {self.arg!r}")
        if self.breakage is not None and self.breakage not in BREAKAGES:
            raise ValueError(f"breakage: expected one of {BREAKAGES}, got {self.breakage!r}")

    def breakages(self) -> list[tuple[str, str]]:
        """The (argument, breakage) pairs this case checks."""
        e = ENTRIES[self.entry]
        return [(a, b) for a in sorted(e.args) if self.arg in (None, a)
                for b in e.args[a].breakages() if self.breakage in (None, b)]


@dataclass(frozen=True)
class Arg:
    """How one argument may be broken: ``dims`` fixed by the other arguments (with ``partners``: the arguments a
    size mismatch may be reported against), ``contiguous`` when a non-contiguous view must be refused, ``bad_dtype``
    a dtype it must refuse, ``ranges``: range breakage -> ``fn(inputs, inner, rng) -> str`` that plants the id in
    ``inputs`` (the built tensors) on a token that uses it and says where (or None when ``inner`` has no such
    token: ``uses(inner)`` tells beforehand)."""

    dims: tuple[int, ...] = ()
    contiguous: bool = False
    bad_dtype: Any = None
    device: bool = True
    ranges: dict = field(default_factory=dict)
    uses: Callable[[Any], bool] | None = None
    partners: tuple[str, ...] = ()
    #: the valid calls that pass this argument at all (an optional tensor: a sink, an extra cache)
    needs: Callable[[Any], bool] | None = None
    #: an output that must not partly overlap this input argument (an exact in-place call aside)
    overlaps: str | None = None
    #: rows that must be back to back (a padded view, each row unit-strided, must be refused)
    packed_rows: bool = False

    def breakages(self) -> tuple[str, ...]:
        out = [f"dim{d}-{s}" for d in self.dims for s in ("small", "large")]
        out += ["dtype"] if self.bad_dtype is not None else []
        out += ["device"] if self.device else []
        out += ["noncontig"] if self.contiguous else []
        out += ["padded"] if self.packed_rows else []
        out += list(OVERLAP_BREAKAGES) if self.overlaps else []
        return tuple(out) + tuple(k for k in RANGE_BREAKAGES if k in self.ranges)


@dataclass(frozen=True)
class Entry:
    """A public entry point: ``name`` (``family.function`` of a subject), its valid cases (``case_type``,
    ``strategy(target)``: the generator of the contract family that calls it), ``build(inner, device, target) ->
    {argument: value}`` (the whole call, keywords), the arguments it must check, and ``plain()``: a small valid case
    that carries every breakage (the fallback where seeded draws find none)."""

    name: str
    case_type: Any
    strategy: Callable[[Any], Any]
    build: Callable[[Any, Any, Any], dict]
    args: dict
    plain: Callable[[], Any] | None = None
    #: the drawn cases that are valid calls (a generator may also draw calls the entry must refuse)
    valid: Callable[[Any], bool] | None = None
    #: ``call(fn, inputs)`` where the entry takes some arguments packed (a dataclass of the subject's family);
    #: None: ``fn(**inputs)``
    call: Callable[[Any, dict], Any] | None = None
    #: arguments every breakage shares (not copied): an object whose identity is its state (a captured graph,
    #: whose replays must find the buffers it captured)
    shared: tuple[str, ...] = ()


# --- breaking a built call --------------------------------------------------------------------------------------

def _grow(t: torch.Tensor, d: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[d] += 1
    fill = -1 if not (t.dtype.is_floating_point or t.dtype == torch.uint8) else 0
    out = torch.full(shape, fill, dtype=t.dtype, device=t.device)
    out.narrow(d, 0, t.shape[d]).copy_(t)
    return out


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a view whose last dimension has stride 2 (its rows are not contiguous)."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device) if t.dim() else t
    view = wide[..., ::2]
    view.copy_(t)
    return view


def _padded(t: torch.Tensor) -> torch.Tensor:
    """The same values in a view whose last dimension keeps a unit stride but whose rows lie one element further
    apart than their width (a slice of a wider buffer)."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype, device=t.device)
    view = wide[..., :t.shape[-1]]
    view.copy_(t)
    return view


def break_inputs(entry: str, arg: str, kind: str, seed: int, inputs: dict, inner) -> str:
    """Apply breakage ``kind`` to ``inputs[arg]`` in place of the valid value; returns what was done (for the
    violation's ``where``). Raises ``LookupError`` when the valid call cannot carry the breakage (a range breakage
    on a call with no token that uses the id, an empty dimension, an optional argument not passed)."""
    spec = ENTRIES[entry].args[arg]
    t = inputs.get(arg)
    if t is None:
        raise LookupError(f"{entry}: this call does not pass {arg}")
    if kind in ID_BREAKAGES:
        where = spec.ranges[kind](inputs, inner, random.Random(seed))
        if where is None:
            raise LookupError(f"{entry}: no token of this call uses {arg}")
        return where
    if not isinstance(t, torch.Tensor):  # a count or a size: its type
        if kind != "dtype":
            raise LookupError(f"{arg}: a {type(t).__name__} has no {kind}")
        inputs[arg] = spec.bad_dtype(t)
        return f"{arg} = {inputs[arg]!r} (a {type(inputs[arg]).__name__}, was {t!r})"
    if kind in OVERLAP_BREAKAGES:
        return _overlap(inputs, arg, spec.overlaps, kind)
    if kind.startswith("dim"):
        d, how = int(kind[3]), kind.split("-")[1]
        if how == "small":
            if t.shape[d] < 1:
                raise LookupError(f"{arg}: dimension {d} is already empty")
            b = t.narrow(d, 0, t.shape[d] - 1)
            inputs[arg] = b.contiguous() if spec.contiguous else b
        else:
            inputs[arg] = _grow(t, d)
        return f"{arg} shape {list(t.shape)} -> {list(inputs[arg].shape)}"
    if kind == "dtype":
        inputs[arg] = t.to(spec.bad_dtype)
        return f"{arg} dtype {t.dtype} -> {spec.bad_dtype}"
    if kind == "device":
        inputs[arg] = t.to("meta")
        return f"{arg} device {t.device} -> meta"
    if kind == "padded":
        if t.dim() < 2 or t.numel() == 0:
            raise LookupError(f"{arg}: {t.dim()} dimension(s), {t.numel()} elements: no rows to pad apart")
        inputs[arg] = _padded(t)
        return f"{arg} strides {list(t.stride())} -> {list(inputs[arg].stride())}"
    if t.dim() == 0 or t.shape[-1] <= 1:
        raise LookupError(f"{arg}: a last dimension of {t.shape[-1] if t.dim() else 0} elements has no stride to break")
    inputs[arg] = _strided(t)
    return f"{arg} strides {list(t.stride())} -> {list(inputs[arg].stride())}"


def _overlap(inputs: dict, arg: str, other: str, kind: str) -> str:
    """``inputs[arg]`` and ``inputs[other]`` (same shape) as two views of one pool sharing exactly one element:
    ``overlap-tail``: arg's first element is other's last; ``overlap-head``: arg's last element is other's first.
    ``other`` keeps its values."""
    src = inputs[other]
    n = src.numel()
    if n < 2:
        raise LookupError(f"{other}: {n} element(s) leave no partial overlap")
    pool = torch.zeros(2 * n - 1, dtype=src.dtype, device=src.device)
    lo, hi = pool[:n].view(src.shape), pool[n - 1:].view(src.shape)
    mine, theirs = (hi, lo) if kind == "overlap-tail" else (lo, hi)
    theirs.copy_(src)
    inputs[other], inputs[arg] = theirs, mine
    first = "first" if kind == "overlap-tail" else "last"
    return f"{arg}'s {first} element is {other}'s {'last' if first == 'first' else 'first'} ({n} elements each)"


def inner_of(case: BadInputCase, arg: str, breakage: str, target=None):
    """The valid call that carries ``arg: breakage`` for ``case``: its own when it can, else one found from its
    seed (:func:`find_inner`); None when there is none."""
    e = ENTRIES[case.entry]
    if case.inner is not None:
        own = e.case_type.from_json(dict(case.inner))
        if carries(e, own, arg, breakage, target, case.seed):
            return own
    return find_inner(e, arg, breakage, case.seed, target)


# --- range breakages: an id just outside its range, on a token that uses it --------------------------------------

def _pick(rng: random.Random, tokens: list[int]) -> int | None:
    return rng.choice(tokens) if tokens else None


def _slot_range(num_slots: Callable[[dict], int], writing: Callable[[Any], list[int]], low: int):
    """``slot_mapping[t] = num_slots`` (high) or ``low`` (low) on a writing token ``t``."""
    def high_fn(inputs, inner, rng):
        t = _pick(rng, writing(inner))
        if t is None:
            return None
        n = num_slots(inputs)
        inputs["slot_mapping"] = inputs["slot_mapping"].clone()
        inputs["slot_mapping"][t] = n
        return f"slot_mapping[{t}] = {n} (num_slots {n}) on a writing token"

    def low_fn(inputs, inner, rng):
        t = _pick(rng, writing(inner))
        if t is None:
            return None
        inputs["slot_mapping"] = inputs["slot_mapping"].clone()
        inputs["slot_mapping"][t] = low
        return f"slot_mapping[{t}] = {low} on a writing token"

    return {"range-high": high_fn} if low is None else {"range-high": high_fn, "range-low": low_fn}


def _cache_slots(inputs: dict) -> int:
    c = inputs["cache"]
    return int(c.shape[0] * c.shape[1])


def _swa_writing(c: fcw.SwaCase) -> list[int]:
    return [t for t, s in enumerate(c.slots) if s >= 0]


def _window_writing(c) -> list[int]:
    """Tokens of a compressor case that write: a slot and a window end ((pos + 1) % ratio == 0)."""
    return [t for t, (p, s) in enumerate(zip(c.positions, c.slots)) if s >= 0 and (p + 1) % c.ratio == 0]


def _req_range(inputs, inner, rng):
    t = _pick(rng, _window_writing(inner))
    if t is None:
        return None
    n = int(inputs["state_block_table"].shape[0])
    inputs["token_to_req"] = inputs["token_to_req"].clone()
    inputs["token_to_req"][t] = n
    return f"token_to_req[{t}] = {n} (the table has {n} rows) on a writing token"


def _req_low(inputs, inner, rng):
    t = _pick(rng, _window_writing(inner))
    if t is None:
        return None
    inputs["token_to_req"] = inputs["token_to_req"].clone()
    inputs["token_to_req"][t] = -1
    return f"token_to_req[{t}] = -1 on a writing token"


def _table_entry(inputs, inner, rng, value_of):
    """A state-block-table entry that a writing token's window reads, set to ``value_of(num_state_blocks)``."""
    t = _pick(rng, _window_writing(inner))
    if t is None:
        return None
    table = inputs["state_block_table"].clone()
    sbs = int(inputs["state"].shape[1])
    r, p = int(inner.reqs[t]), int(inner.positions[t])
    col = p // sbs
    v = value_of(int(inputs["state"].shape[0]))
    table[r, col] = v
    inputs["state_block_table"] = table
    return f"state_block_table[{r}, {col}] = {v} (read by writing token {t}, position {p})"


def _table_high(inputs, inner, rng):
    return _table_entry(inputs, inner, rng, lambda n: n)


def _table_low(inputs, inner, rng):
    return _table_entry(inputs, inner, rng, lambda n: -1)


def _cos_sin_short(inputs, inner, rng):
    """The cos/sin table one row short of the RoPE row a writing token needs (its last row dropped, where the
    writing token with the highest position needs exactly that row)."""
    ws = _window_writing(inner)
    if not ws:
        return None
    ratio = inner.ratio
    need = max((inner.positions[t] // ratio) * ratio for t in ws)
    inputs["cos_sin_cache"] = inputs["cos_sin_cache"][:need].clone()
    return f"cos_sin_cache rows {need} (a writing token needs row {need})"


def _pos_low(inputs, inner, rng):
    t = _pick(rng, _window_writing(inner))
    if t is None:
        return None
    inputs["positions"] = inputs["positions"].clone()
    inputs["positions"][t] = -1
    return f"positions[{t}] = -1 on a token with a slot"


def _has_writer(c) -> bool:
    return bool(_window_writing(c))


# --- the entry points --------------------------------------------------------------------------------------------

def _layout_plain() -> LayoutCase:
    return LayoutCase(layout="fp8_ds_mla", block_size=3, num_blocks=2, stride_pad=7, offset_blocks=1, seed=11,
                      num_tokens=4)


def _fp8_layout_cases(target=None):
    return layout_cases().filter(lambda c: c.layout == "fp8_ds_mla")


def _layout_cache(c: LayoutCase, device):
    from impl.formats import DSV4_TOKEN_BYTES

    stride0 = c.block_size * DSV4_TOKEN_BYTES + c.stride_pad
    g = torch.Generator().manual_seed(c.seed)
    pool = torch.randint(0, 256, ((c.offset_blocks + c.num_blocks) * stride0,), generator=g,
                         dtype=torch.int64).to(torch.uint8).to(device)
    return pool.as_strided((c.num_blocks, c.block_size, DSV4_TOKEN_BYTES), (stride0, DSV4_TOKEN_BYTES, 1),
                           c.offset_blocks * stride0), g


def _layout_slots(c: LayoutCase, g) -> torch.Tensor:
    n = min(c.num_tokens, c.block_size * c.num_blocks)
    return torch.randperm(c.block_size * c.num_blocks, generator=g)[:n]


def _build_pack(c: LayoutCase, device, target=None) -> dict:
    cache, g = _layout_cache(c, device)
    slots = _layout_slots(c, g)
    n = slots.numel()
    return {"cache": cache, "slots": slots,
            "nope_codes": torch.randint(0, 256, (n, 448), generator=g, dtype=torch.int32).to(torch.uint8),
            "scale_codes": torch.randint(0, 256, (n, 7), generator=g, dtype=torch.int32).to(torch.uint8),
            "rope": torch.randn(n, 64, generator=g).to(torch.bfloat16)}


def _build_unpack(c: LayoutCase, device, target=None) -> dict:
    cache, g = _layout_cache(c, device)
    return {"cache": cache, "slots": _layout_slots(c, g)}


def _build_dequant(c: LayoutCase, device, target=None) -> dict:
    return {**_build_unpack(c, device), "flavour": "ocp"}


def _slots_range(inputs, inner, rng):
    s = inputs["slots"].clone()
    i = rng.randrange(s.numel())
    n = _cache_slots(inputs)
    s[i] = n
    inputs["slots"] = s
    return f"slots[{i}] = {n} (num_slots {n})"


def _slots_low(inputs, inner, rng):
    s = inputs["slots"].clone()
    i = rng.randrange(s.numel())
    s[i] = -1
    inputs["slots"] = s
    return f"slots[{i}] = -1 (no entry may skip)"


_HOST_CACHE = Arg(dims=(2,), bad_dtype=torch.int8, device=False)  # host functions: any device holds a cache
_SLOTS = Arg(bad_dtype=torch.float32, device=False, ranges={"range-high": _slots_range, "range-low": _slots_low})
_FORMAT_READ_ARGS = {"cache": _HOST_CACHE, "slots": _SLOTS}


def _swa_plain() -> fcw.SwaCase:
    return fcw.SwaCase(seed=3, T=3, slots=(4, -1, 0), log_scale=(0, 3, -3), block_size=3, padded=True,
                       extra_blocks_before=1, num_blocks=2)


def _build_swa(c: fcw.SwaCase, device, target=None) -> dict:
    k, slots = fcw.build_swa_inputs(c, device)
    _, cache = fcw.build_cache(c, device)
    return {"k": k, "slot_mapping": slots, "cache": cache}


def _compressor_plain() -> fcw.CompressorCase:
    return fcw.CompressorCase(seed=5, ratio=4, state_block_size=3, positions=(7, 10, 3), reqs=(0, 1, 1),
                              slots=(1, -1, 0), num_reqs=2, block_size=2, num_blocks=2, padded=True)


def _build_compressor(c: fcw.CompressorCase, device, target=None) -> dict:
    _, cache = fcw.build_cache(c, device)
    # a two-stage call passes its variant and split count (absent: the single pass, which takes no splits)
    stage = {"two_stage": True, "splits": c.splits} if c.two_stage else {}
    return {**fcw.build_compressor_inputs(c, device), "cache": cache, "ratio": c.ratio, **stage}


def _two_stage_plain() -> fcw.CompressorCase:
    """A ratio-128 two-stage call with an explicit split count (the ``splits`` breakages need one passed)."""
    return fcw.CompressorCase(seed=5, ratio=128, state_block_size=8, positions=(127,), reqs=(0,), slots=(1,),
                              num_reqs=1, block_size=2, num_blocks=1, two_stage=True, splits=4)


def _splits_arg() -> Arg:
    """``splits`` of a two-stage compressor call: a power of two in [1, TWO_STAGE_MAX_SPLITS = 16]; 0 must be refused
    by the check itself, not by the division by zero that follows it (a ZeroDivisionError is no refusal)."""
    return Arg(bad_dtype=float, device=False, needs=lambda c: c.two_stage and c.splits is not None, ranges={
        "range-low": _set("splits", lambda v, i: 0, "; zero splits"),
        "range-high": _set("splits", lambda v, i: 32, "; past the 16 a two-stage call may take")})


def _direct_plain() -> fiw.DirectCase:
    return fiw.DirectCase(seed=9, T=3, slots=(2, -1, 0), log_scale=(0, 1, 2), block_size=3, num_blocks=2,
                          layout="normal", stride_pad=4, extra_blocks_before=1)


def _build_direct(c: fiw.DirectCase, device, target=None) -> dict:
    k, slots = fiw.build_direct_inputs(c, device)
    _, cache = fiw.build_pool(c, fiw.TOKEN_BYTES["fp8"], device)
    layout = None if c.layout == "default" else c.layout
    return {"k": k, "cache": cache, "slot_mapping": slots, "scale_fmt": c.scale_fmt, "layout": layout}


def _indexer_compressor_plain() -> fiw.IndexerCompressorCase:
    return fiw.IndexerCompressorCase(seed=7, positions=(7, 10, 3), reqs=(0, 1, 1), slots=(1, -1, 0), num_reqs=2,
                                     block_size=3, num_blocks=1, state_block_size=3, stride_pad=4,
                                     extra_blocks_before=1)


def _build_indexer_compressor(c: fiw.IndexerCompressorCase, device, target=None) -> dict:
    _, cache = fiw.build_pool(c, fiw.TOKEN_BYTES[c.kv_format], device)
    layout = None if c.layout == "default" else c.layout
    return {**fiw.build_compressor_inputs(c, device), "cache": cache, "ratio": c.ratio, "kv_format": c.kv_format,
            "layout": layout, "mx_scale": c.mx_scale}


def _direct_cases(target=None):
    return fiw.direct_cases().filter(lambda c: not c.refused)


def _window_args(head_partners: tuple[str, ...], slot_low) -> dict:
    """The arguments every compressor shares (impl.compressor.check_window_inputs and the writer's slots)."""
    return {
        "state": Arg(dims=(2,), bad_dtype=torch.bfloat16),
        "state_block_table": Arg(dims=(), bad_dtype=torch.float32, ranges={"range-high": _table_high,
                                                                           "range-low": _table_low},
                                 uses=_has_writer),
        "token_to_req": Arg(dims=(0,), bad_dtype=torch.float32, partners=("positions",),
                            ranges={"range-high": _req_range, "range-low": _req_low}, uses=_has_writer),
        "positions": Arg(dims=(0,), bad_dtype=torch.int32, partners=("token_to_req", "slot_mapping"),
                         ranges={"range-low": _pos_low}, uses=_has_writer),
        "slot_mapping": Arg(dims=(0,), bad_dtype=torch.int32, partners=("positions",),
                            ranges=_slot_range(_cache_slots, _window_writing, slot_low), uses=_has_writer),
        "norm_weight": Arg(dims=(0,), contiguous=True, bad_dtype=torch.float16),
        "cos_sin_cache": Arg(dims=(1,), bad_dtype=torch.float64, ranges={"range-high": _cos_sin_short},
                             uses=_has_writer),
        "cache": Arg(dims=(2,), bad_dtype=torch.int8),
    }


# --- decode, prefill, gather, ragged helpers, epilogues, router, codecs -----------------------------------------

def _indptr_range(indptr: str, indices: str, high: bool):
    """``indptr[-1] = indices.numel() + 1`` (past its indices) or ``indptr[0] = -1``: every row reads it."""
    def fn(inputs, inner, rng):
        ip = inputs[indptr].clone()
        v = inputs[indices].numel() + 1 if high else -1
        ip[-1 if high else 0] = v
        inputs[indptr] = ip
        return f"{indptr}[{-1 if high else 0}] = {v} ({indices} holds {inputs[indices].numel()})"
    return fn


def _build_decode(c: fdec.DecodeCase, device, target) -> dict:
    inp = fdec.build_decode_inputs(c, target, device)
    kw = {"q": inp.q, "main_cache": inp.main_cache, "main_indices": inp.main_indices,
          "main_indptr": inp.main_indptr, "attn_sink": inp.attn_sink, "softmax_scale": inp.softmax_scale,
          "cu_count": c.cu_count}
    if inp.extra_cache is not None:
        kw.update(extra_cache=inp.extra_cache, extra_indices=inp.extra_indices, extra_indptr=inp.extra_indptr)
    return kw


def _decode_segment(prefix: str, needs=None) -> dict:
    return {f"{prefix}_cache": Arg(dims=(2,), bad_dtype=torch.int8, needs=needs),
            f"{prefix}_indices": Arg(bad_dtype=torch.int64, needs=needs),
            f"{prefix}_indptr": Arg(dims=(0,), bad_dtype=torch.int64, partners=("q",), needs=needs, ranges={
                "range-high": _indptr_range(f"{prefix}_indptr", f"{prefix}_indices", True),
                "range-low": _indptr_range(f"{prefix}_indptr", f"{prefix}_indices", False)})}


def _build_prefill(c, device, target) -> dict:
    inp = fpre.build_prefill_inputs(c, device)
    return {"q": inp.q, "kv": inp.kv, "indices": inp.indices, "softmax_scale": inp.softmax_scale,
            "attn_sink": inp.attn_sink, "out": inp.out, "topk_length": inp.topk_length, "indptr": inp.indptr}


_GATHER_ARGS = ("k_cache", "k_fp8", "k_scale", "block_table", "cu_seqlen", "token_to_seq", "layout")


def _build_gather(c, device, target) -> dict:
    kw = fcg.build_gather_inputs(c, device)  # also the pool and whole output buffers, which the call is not given
    return {k: kw[k] for k in _GATHER_ARGS}


def _cu_range(high: bool):
    def fn(inputs, inner, rng):
        cu = inputs["cu_seqlen"].clone()
        v = inputs["k_fp8"].shape[0] + 1 if high else -1
        cu[-1 if high else 0] = v
        inputs["cu_seqlen"] = cu
        return f"cu_seqlen[{-1 if high else 0}] = {v} (k_fp8 has {inputs['k_fp8'].shape[0]} rows)"
    return fn


def _ragged(helper: str):
    def build(c, device, target):
        return frg.make_inputs(c, helper, device)
    return build


def _ragged_cases(target=None):
    return frg.ragged_cases()


def _build_rope(c, device, target) -> dict:
    x, cos_sin, positions = fep.rope_input(c, device)
    return {"x": x, "cos_sin": cos_sin, "positions": positions, "out": torch.zeros_like(x)}


def _position_range(high: bool):
    def fn(inputs, inner, rng):
        pos = inputs["positions"].clone()
        t = rng.randrange(pos.numel())
        v = inputs["cos_sin"].shape[0] if high else -1
        pos[t] = v
        inputs["positions"] = pos
        return f"positions[{t}] = {v} (cos_sin has {inputs['cos_sin'].shape[0]} rows)"
    return fn


def _build_mxfp8(c, device, target) -> dict:
    return {"x": fep.mxfp8_input(c, device)}


def _build_router(c, device, target) -> dict:
    logits, bias = frt.make_inputs(c)
    gate = logits.to(torch.bfloat16) if c.gate_dtype == "bf16" else logits
    return {"gating_output": gate.to(device), "correction_bias": bias.to(device), "topk": c.topk,
            "n_group": c.n_group, "topk_group": c.topk_group, "renormalize": c.renormalize,
            "routed_scaling_factor": c.routed_scaling_factor}


def _fp8_values(c: Fp8Case) -> torch.Tensor:
    return torch.tensor(c.values, dtype=torch.float32)


def _codec_builds():
    def codes(c):
        return (_fp8_values(c).view(torch.int32) & 0xFF).to(torch.uint8)

    return {
        "codec_kernels.fp8_decode_triton": (Fp8Case, lambda t=None: fp8_cases({"ocp", "fnuz"}),
                                            lambda c, d, t: {"codes": codes(c), "flavour": c.flavour}, "codes",
                                            torch.int8),
        "codec_kernels.fp8_encode_triton": (Fp8Case, lambda t=None: fp8_cases({"ocp", "fnuz"}),
                                            lambda c, d, t: {"x": _fp8_values(c), "flavour": c.flavour}, "x",
                                            torch.float64),
        "codec_kernels.ue8m0_decode_reader_triton": (Fp8Case, lambda t=None: fp8_cases({"ocp"}),
                                                     lambda c, d, t: {"codes": codes(c)}, "codes", torch.int8),
        # the host codecs (impl.formats): the writers' and readers' reference bit patterns
        "formats.fp8_decode": (Fp8Case, lambda t=None: fp8_cases({"ocp", "fnuz"}),
                               lambda c, d, t: {"codes": codes(c), "flavour": c.flavour}, "codes", torch.int8),
        "formats.fp8_encode": (Fp8Case, lambda t=None: fp8_cases({"ocp", "fnuz"}),
                               lambda c, d, t: {"x": _fp8_values(c), "flavour": c.flavour}, "x", torch.int32),
        "formats.ue8m0_decode": (Fp8Case, lambda t=None: fp8_cases({"ocp"}), lambda c, d, t: {"codes": codes(c)},
                                 "codes", torch.int8),
        "formats.ue8m0_decode_reader": (Fp8Case, lambda t=None: fp8_cases({"ocp"}),
                                        lambda c, d, t: {"codes": codes(c)}, "codes", torch.int8),
        "codec_kernels.ue8m0_encode_triton": (Ue8m0Case, lambda t=None: ue8m0_cases(254),
                                              lambda c, d, t: {"scale": torch.tensor(c.scales, dtype=torch.float32),
                                                               "cap": c.cap}, "scale", torch.float64),
    }


def _build_paged_logits(c, device, target) -> dict:
    inp = fil.build_decode_inputs(c, target.main_cache_fp8, device)
    return {"q": inp.q, "kv_cache": inp.cache, "weights": inp.weights, "context_lens": inp.context_lens,
            "block_tables": inp.block_table, "max_model_len": c.max_model_len, "layout": c.layout}


def _ctx_high(inputs, inner, rng):
    ctx = inputs["context_lens"].clone()
    i = rng.randrange(ctx.numel())
    v = inputs["max_model_len"] + ctx.dim()  # a row then sees past max_model_len (per-row lengths: by one)
    ctx.view(-1)[i] = v + (inner.next_n - 1 if ctx.dim() == 1 else 0)
    inputs["context_lens"] = ctx
    return f"context_lens[{i}] = {int(ctx.view(-1)[i])} (max_model_len {inputs['max_model_len']})"


def _table_block_high(inputs, inner, rng):
    """A block id one past the pool in a table column a visible position reads."""
    live = [b for b, rows in enumerate(inner.visible()) if max(rows) > 0]
    if not live:
        return None
    b = rng.choice(live)
    table = inputs["block_tables"].clone()
    nb = int(inputs["kv_cache"].shape[0])
    table[b, 0] = nb
    inputs["block_tables"] = table
    return f"block_tables[{b}, 0] = {nb} (the pool has {nb} blocks; request {b} reads position 0)"


def _build_prefill_logits(c, device, target) -> dict:
    inp = fil.build_prefill_inputs(c, target.main_cache_fp8, device)
    return {"q": inp.q, "k_fp8": inp.k_fp8, "k_scale": inp.k_scale, "weights": inp.weights, "ks": inp.ks,
            "ke": inp.ke}


def _row_bound(name: str, high: bool):
    def fn(inputs, inner, rng):
        v = inputs[name].clone()
        t = rng.randrange(v.numel())
        v[t] = inputs["k_fp8"].shape[0] + 1 if high else -1
        inputs[name] = v
        return f"{name}[{t}] = {int(v[t])} (k_fp8 has {inputs['k_fp8'].shape[0]} keys)"
    return fn


def _build_graph_buffers(c, device, target) -> dict:
    inp = fgb.graph_buffer_inputs(c)
    return {"ragged_indices": inp.source.to(device),
            "ragged_indptr": torch.tensor(inp.indptr, dtype=torch.int32, device=device),
            "indices_buffer": torch.zeros(inp.indices_len, dtype=torch.int32, device=device),
            "indptr_buffer": torch.zeros(inp.indptr_len, dtype=torch.int32, device=device),
            "num_rows": c.num_rows, "max_per_row": c.max_per_row}


def _graph_entry() -> Entry:
    return Entry("graph_buffers.copy_ragged_to_graph_buffers", fgb.GraphBufferCase,
                 lambda t=None: fgb.graph_buffer_cases(defects=False), _build_graph_buffers, {
                     "ragged_indices": Arg(bad_dtype=torch.int64),
                     "ragged_indptr": Arg(dims=(0,), bad_dtype=torch.int64, partners=("num_rows",), ranges={
                         "range-high": _indptr_range("ragged_indptr", "ragged_indices", True),
                         "range-low": _indptr_range("ragged_indptr", "ragged_indices", False)}),
                     # the device of the call is the indices buffer's: moving it is reported against the others
                     "indices_buffer": Arg(contiguous=True, bad_dtype=torch.int64, device=False),
                     "indptr_buffer": Arg(contiguous=True, bad_dtype=torch.int64),
                 })


def _indexer_layout_cases(target=None):
    return layout_cases().filter(lambda c: c.layout != "fp8_ds_mla")


def _indexer_cache(c: LayoutCase, device):
    from impl.formats import INDEXER_TOKEN_BYTES

    stride0 = c.block_size * INDEXER_TOKEN_BYTES + c.stride_pad
    g = torch.Generator().manual_seed(c.seed)
    pool = torch.randint(0, 256, ((c.offset_blocks + c.num_blocks) * stride0,), generator=g,
                         dtype=torch.int64).to(torch.uint8).to(device)
    return pool.as_strided((c.num_blocks, c.block_size, INDEXER_TOKEN_BYTES), (stride0, INDEXER_TOKEN_BYTES, 1),
                           c.offset_blocks * stride0), g


def _build_pack_indexer(c: LayoutCase, device, target=None) -> dict:
    cache, g = _indexer_cache(c, device)
    slots = _layout_slots(c, g)
    n = slots.numel()
    return {"cache": cache, "slots": slots,
            "k_codes": torch.randint(0, 256, (n, 128), generator=g, dtype=torch.int32).to(torch.uint8),
            "k_scale": torch.rand(n, generator=g) + 0.5, "layout": c.layout.split("-")[1]}


def _build_unpack_indexer(c: LayoutCase, device, target=None) -> dict:
    cache, g = _indexer_cache(c, device)
    return {"cache": cache, "slots": _layout_slots(c, g), "layout": c.layout.split("-")[1]}


def _indexer_format_entries() -> list[Entry]:
    read = {"cache": _HOST_CACHE, "slots": _SLOTS}  # the record width checked: the indexer's 132 bytes
    return [
        Entry("formats.pack_indexer_k", LayoutCase, _indexer_layout_cases, _build_pack_indexer, {
            **read,
            "k_codes": Arg(dims=(0, 1), bad_dtype=torch.int8, device=False, partners=("slots",)),
            "k_scale": Arg(dims=(0,), bad_dtype=torch.float16, device=False, partners=("slots",)),
        }),
        Entry("formats.unpack_indexer_k", LayoutCase, _indexer_layout_cases, _build_unpack_indexer, read),
    ]


def _logits_entries() -> list[Entry]:
    return [
        Entry("indexer_logits.fp8_paged_mqa_logits", fil.IndexerLogitsCase, lambda t=None: fil.decode_cases(),
              _build_paged_logits, {
                  "q": Arg(dims=(0, 3), bad_dtype=torch.float32,
                           partners=("weights", "context_lens", "block_tables")),
                  "kv_cache": Arg(dims=(2,), bad_dtype=torch.int8),
                  "weights": Arg(dims=(0, 1), contiguous=True, bad_dtype=torch.float16, partners=("q",)),
                  "context_lens": Arg(dims=(0,), bad_dtype=torch.float32, partners=("q", "max_model_len"),
                                      ranges={"range-high": _ctx_high}),
                  "block_tables": Arg(dims=(0,), contiguous=True, bad_dtype=torch.float32, partners=("q",),
                                      ranges={"range-high": _table_block_high},
                                      uses=lambda c: any(max(r) > 0 for r in c.visible())),
              }),
        Entry("indexer_logits.fp8_mqa_logits", fil.IndexerLogitsCase, lambda t=None: fil.prefill_cases(),
              _build_prefill_logits, {
                  "q": Arg(dims=(0, 2), bad_dtype=torch.float32, partners=("weights", "ks", "ke")),
                  "k_fp8": Arg(dims=(0, 1), bad_dtype=torch.float32, partners=("k_scale", "ke")),
                  "k_scale": Arg(dims=(0,), bad_dtype=torch.float16, partners=("k_fp8",)),
                  "weights": Arg(dims=(0, 1), bad_dtype=torch.float16, partners=("q",)),
                  "ks": Arg(dims=(0,), bad_dtype=torch.float32, partners=("q",),
                            ranges={"range-low": _row_bound("ks", False)}),
                  "ke": Arg(dims=(0,), bad_dtype=torch.float32, partners=("q",),
                            ranges={"range-high": _row_bound("ke", True)}),
              }),
    ]


def _more_entries() -> list[Entry]:
    has_extra = lambda c: c.extra_lens is not None  # noqa: E731
    out = [
        Entry("decode.sparse_attn_decode", fdec.DecodeCase, fdec.decode_cases, _build_decode, {
            "q": Arg(dims=(0, 2), bad_dtype=torch.float16, partners=("main_indptr", "extra_indptr")),
            **_decode_segment("main"), **_decode_segment("extra", has_extra),
            "attn_sink": Arg(bad_dtype=torch.bfloat16, needs=lambda c: c.sink != "none"),
        }, valid=lambda c: not fdec.refusable(c)),  # layouts the decode may refuse are no valid call to break
        Entry("prefill.sparse_attn_prefill", fpre.PrefillCase, lambda t=None: fpre.prefill_cases(), _build_prefill, {
            "q": Arg(dims=(0, 2), bad_dtype=torch.float32,
                     partners=("kv", "indices", "indptr", "topk_length", "out")),
            "kv": Arg(bad_dtype=torch.float32),
            "indices": Arg(bad_dtype=torch.float32),
            "topk_length": Arg(dims=(0,), bad_dtype=torch.float32, partners=("q", "indices"),
                               needs=lambda c: c.mode == "dense" and c.topk_given),
            "indptr": Arg(dims=(0,), bad_dtype=torch.int64, partners=("q",), needs=lambda c: c.mode == "ragged",
                          ranges={"range-high": _indptr_range("indptr", "indices", True),
                                  "range-low": _indptr_range("indptr", "indices", False)}),
            "attn_sink": Arg(bad_dtype=torch.bfloat16, needs=lambda c: c.sink != "none"),
            "out": Arg(dims=(0, 1), bad_dtype=torch.int32, partners=("q",)),
        }, valid=lambda c: not fpre.refusable(c)),  # layouts the prefill may refuse are no valid call to break
        Entry("cp_gather.cp_gather_indexer_k_quant_cache", fcg.CpGatherCase, lambda t=None: fcg.gather_cases(),
              _build_gather, {
                  "k_cache": Arg(dims=(2,), bad_dtype=torch.int8),
                  "k_fp8": Arg(dims=(0, 1), bad_dtype=torch.int8, partners=("token_to_seq", "cu_seqlen", "k_scale")),
                  "k_scale": Arg(dims=(0, 1), bad_dtype=torch.int8, partners=("k_fp8",)),
                  "block_table": Arg(dims=(0,), bad_dtype=torch.float32, partners=("cu_seqlen",)),
                  "cu_seqlen": Arg(dims=(0,), bad_dtype=torch.float32, partners=("block_table",),  # rows / columns
                                   ranges={"range-high": _cu_range(True), "range-low": _cu_range(False)}),
                  "token_to_seq": Arg(dims=(0,), bad_dtype=torch.float32, partners=("k_fp8",)),
              }, valid=lambda c: not c.narrow_table),  # a sequence its table row cannot cover is refused
        Entry("ragged.build_ragged_indices_from_dense", frg.RaggedCase, _ragged_cases, _ragged("dense"), {
            "dense_indices": Arg(bad_dtype=torch.float32, device=False),
            "topk_lens": Arg(dims=(0,), bad_dtype=torch.float32, partners=("dense_indices",),
                             needs=lambda c: c.dense.lens is not None),
        }),
        Entry("ragged.compute_global_topk_ragged_indices_and_indptr", frg.RaggedCase, _ragged_cases,
              _ragged("global"), {
                  "local_indices": Arg(bad_dtype=torch.float32, device=False),
                  "token_to_req": Arg(dims=(0,), bad_dtype=torch.float32, partners=("local_indices",)),
                  "block_table": Arg(bad_dtype=torch.float32),
                  "is_valid_token": Arg(dims=(0,), bad_dtype=torch.int32, needs=lambda c: c.glob.valid is not None),
              }),
        Entry("ragged.compute_swa_indices_and_lens", frg.RaggedCase, _ragged_cases, _ragged("swa"), {
            "positions": Arg(bad_dtype=torch.float32, device=False),
            "token_to_req": Arg(dims=(0,), bad_dtype=torch.float32, partners=("positions",)),
            "block_table": Arg(bad_dtype=torch.float32),
        }),
        Entry("epilogues.inverse_rope_gptj", fep.RopeCase, lambda t=None: fep.rope_cases(), _build_rope, {
            "x": Arg(dims=(0,), contiguous=True, bad_dtype=torch.float16, partners=("positions",)),
            "cos_sin": Arg(dims=(1,), contiguous=True, bad_dtype=torch.float64),
            "positions": Arg(dims=(0,), contiguous=True, bad_dtype=torch.float32, partners=("x",),
                             ranges={"range-high": _position_range(True), "range-low": _position_range(False)}),
            "out": Arg(dims=(0, 1, 2), contiguous=True, bad_dtype=torch.int32, partners=("x",), overlaps="x"),
        }, valid=lambda c: not fep.rope_refusable(c)),  # an overlapping out or a strided layout may be refused
        Entry("epilogues.mxfp8_quantize", fep.Mxfp8Case, lambda t=None: fep.mxfp8_cases(), _build_mxfp8, {
            "x": Arg(dims=(1,), contiguous=True, bad_dtype=torch.float16),
        }),
        Entry("router.biased_grouped_topk", frt.RouterCase, lambda t=None: frt.router_cases(), _build_router, {
            "gating_output": Arg(bad_dtype=torch.int32, device=False),
            "correction_bias": Arg(dims=(0,), bad_dtype=torch.int32, partners=("gating_output",)),
        }),
    ]
    out += _logits_entries() + [_graph_entry()] + _indexer_format_entries()
    out += [_metadata_entry(), _assembly_entry(), _reduce_entry(), _consumer_entry(), _prefill_launch_entry()]
    out += [_fill_entry(), _epilogue_entry()] + _topk_entries() + _layer_entries() + _graph_entries()
    for name, (ctype, strat, build, arg, bad) in _codec_builds().items():
        out.append(Entry(name, ctype, strat, build, {arg: Arg(bad_dtype=bad, device=False)}))
    return out + [_ue8m0_encode_entry()]


def _ue8m0_encode_entry() -> Entry:
    return Entry("formats.ue8m0_encode", Ue8m0Case, lambda t=None: ue8m0_cases(254), lambda c, d, t: {
        "scale": torch.tensor(c.scales, dtype=torch.float32), "cap": c.cap}, {
            "scale": Arg(bad_dtype=torch.int32, device=False, ranges={"range-low": _entry_at(
                "scale", lambda c, i, r: r.randrange(i["scale"].numel()), lambda t, i, inp: 0.0, "scales are > 0")}),
            # cap: 254.0 equals 254 and is taken as it (no type breakage): only values outside {254, 255}
            "cap": Arg(device=False, ranges={"range-low": _set("cap", lambda v, i: 253),
                                             "range-high": _set("cap", lambda v, i: 256)}),
        })


# --- metadata builders, prefill assembly, reduce, partition consumer, graph capture ------------------------------

def _set(name: str, value_of: Callable[[Any, dict], Any], say: str = ""):
    """A range breakage of a count or a size: ``inputs[name] = value_of(current, inputs)``."""
    def fn(inputs, inner, rng):
        was = inputs[name]
        inputs[name] = value_of(was, inputs)
        return f"{name} = {inputs[name]} (was {was}{say})"
    return fn


def _entry_at(name: str, index_of: Callable[[Any, dict, random.Random], int | None], value_of, say: str):
    """A range breakage of one entry of a 1-D tensor: ``t[i] = value_of(t, i, inputs)`` at ``index_of``."""
    def fn(inputs, inner, rng):
        i = index_of(inner, inputs, rng)
        if i is None:
            return None
        t = inputs[name].clone()
        v = value_of(t, i, inputs)
        t[i] = v
        inputs[name] = t
        return f"{name}[{i}] = {v} ({say})"
    return fn


#: the length a padded request past num_reqs carries (a scheduler's padding; the builder reads the first R only)
PAD_SEQ_LEN = 77


def _metadata_cases(target=None):
    return fsm.metadata_case(min_steps=1, max_steps=2)


def _build_metadata(c, device, target) -> dict:
    """A fresh builder of the case's configuration and its last step's scheduler metadata, as keywords (the
    ``CommonMetadata`` fields flat, so that each is broken alone; :func:`_call_metadata` packs them)."""
    from impl.sparse_metadata import SparseMLAMetadataBuilder

    cfg, step = c.config, c.steps[-1]
    b = SparseMLAMetadataBuilder(cfg.max_tokens, cfg.num_heads, topk_tokens=cfg.topk, block_size=cfg.block_size,
                                 target=target, kv_granularity=cfg.granularity, use_aiter=False, device=device)
    starts = [0]
    for q in step.q_lens:
        starts.append(starts[-1] + q)
    starts += [starts[-1]] * step.pad
    seq = torch.tensor(list(step.seq_lens) + [PAD_SEQ_LEN] * step.pad, dtype=torch.int32)  # lengths no request has
    qsl = torch.tensor(starts, dtype=torch.int32)
    R = len(step.q_lens)
    width = max(1, -(-max(step.seq_lens) // cfg.block_size))  # every position of every context has a block
    return {"self": b, "query_start_loc": qsl.to(device), "query_start_loc_cpu": qsl, "seq_lens": seq.to(device),
            "seq_lens_cpu": seq.clone() if step.host_lens else None, "num_reqs": R,
            "num_actual_tokens": starts[R], "max_query_len": max(step.q_lens),
            "block_table": torch.ones(R + step.pad, width, dtype=torch.int32, device=device)}


def _call_metadata(fn, kw: dict):
    import sys

    builder = kw.pop("self")
    return fn(builder, sys.modules[type(builder).__module__].CommonMetadata(**kw))


def _last_req(inner, inputs, rng):
    return rng.randrange(len(inner.steps[-1].q_lens))


def _metadata_entry() -> Entry:
    host = lambda c: c.steps[-1].host_lens  # noqa: E731 - seq_lens_cpu passed (the device copy is then not read)
    counts = ("query_start_loc_cpu", "num_actual_tokens", "num_reqs", "max_query_len")
    neg = lambda n: _set(n, lambda v, i: -1, "; a negative count")  # noqa: E731
    return Entry("sparse_metadata.SparseMLAMetadataBuilder.build", fsm.MetadataCase, _metadata_cases, _build_metadata, {
        "query_start_loc_cpu": Arg(bad_dtype=torch.float32, partners=counts, ranges={
            "range-high": _entry_at("query_start_loc_cpu", lambda c, i, r: len(c.steps[-1].q_lens),
                                    lambda t, i, inp: int(t[i]) + 1, "one past the last token"),
            "range-low": _entry_at("query_start_loc_cpu", lambda c, i, r: 0, lambda t, i, inp: -1,
                                   "offsets start at 0")}),
        "query_start_loc": Arg(bad_dtype=torch.float32),
        "seq_lens": Arg(bad_dtype=torch.float32, uses=lambda c: not host(c), ranges={
            "range-low": _entry_at("seq_lens", _last_req, lambda t, i, inp: -1, "a negative length")}),
        "seq_lens_cpu": Arg(bad_dtype=torch.float32, needs=host, ranges={
            "range-low": _entry_at("seq_lens_cpu", _last_req, lambda t, i, inp: -1, "a negative length")}),
        "num_reqs": Arg(bad_dtype=float, device=False, partners=counts, ranges={"range-low": neg("num_reqs")}),
        "num_actual_tokens": Arg(bad_dtype=float, device=False, partners=counts, ranges={
            "range-low": neg("num_actual_tokens"),
            "range-high": _set("num_actual_tokens", lambda v, i: v + 1, "; the offsets end one short")}),
        "max_query_len": Arg(bad_dtype=float, device=False, partners=counts, ranges={
            "range-low": neg("max_query_len"),
            "range-high": _set("max_query_len", lambda v, i: v + 1, "; one past the longest query")}),
        "block_table": Arg(bad_dtype=torch.float32),
    }, call=_call_metadata)


def _builder_cases(target=None):
    return fds.builder_cases()


def _build_layer(c, device, target) -> dict:
    pos, t2r, swa, table = fds.builder_inputs(c, device)
    kw = {"compress_ratio": c.compress_ratio, "positions": pos, "token_to_req": t2r, "swa_block_table": swa,
          "swa_block_size": fds.BUILDER_SIZES["swa_block_size"]}
    if c.compress_ratio > 1:
        kw.update(block_table=table.to(device), block_size=fds.BUILDER_SIZES["block_size"])
    if c.compress_ratio == 128:
        kw["max_model_len"] = fds.BUILDER_SIZES["max_model_len"]
    return kw


def _build_builder(c, device, target) -> dict:
    from impl.dsv4_step import Dsv4MetadataBuilder

    kw = _build_layer(c, device, target)
    b = Dsv4MetadataBuilder(kw.pop("compress_ratio"), swa_block_size=kw.pop("swa_block_size"),
                            block_size=kw.pop("block_size", None), max_model_len=kw.pop("max_model_len", None),
                            target=target)
    return {"self": b, **kw}


def _req_of_token(high: bool):
    def fn(inputs, inner, rng):
        t2r = inputs["token_to_req"].clone()
        i = rng.randrange(t2r.numel())
        v = int(inputs["swa_block_table"].shape[0]) if high else -1
        t2r[i] = v
        inputs["token_to_req"] = t2r
        return f"token_to_req[{i}] = {v} (swa_block_table has {inputs['swa_block_table'].shape[0]} rows)"
    return fn


def _layer_tensor_args() -> dict:
    compressed = lambda c: c.compress_ratio > 1  # noqa: E731
    return {
        "positions": Arg(dims=(0,), bad_dtype=torch.int32, partners=("token_to_req",)),
        "token_to_req": Arg(dims=(0,), bad_dtype=torch.float32, partners=("positions", "swa_block_table"),
                            ranges={"range-high": _req_of_token(True), "range-low": _req_of_token(False)}),
        "swa_block_table": Arg(bad_dtype=torch.float32),
        "block_table": Arg(dims=(0,), bad_dtype=torch.float32, partners=("swa_block_table",), needs=compressed),
    }


def _layer_entries() -> list[Entry]:
    compressed = lambda c: c.compress_ratio > 1  # noqa: E731
    scalars = {
        "compress_ratio": Arg(bad_dtype=float, device=False, ranges={
            "range-high": _set("compress_ratio", lambda v, i: v + 1 if v > 1 else 2, "; no layer kind"),
            "range-low": _set("compress_ratio", lambda v, i: -1, "; a negative ratio")}),
        "swa_block_size": Arg(bad_dtype=float, device=False,
                              ranges={"range-low": _set("swa_block_size", lambda v, i: 0)}),
        "block_size": Arg(bad_dtype=float, device=False, needs=compressed, ranges={
            "range-low": _set("block_size", lambda v, i: 0),
            "range-high": _set("block_size", lambda v, i: v + 1, "; not a multiple of the ratio")}),
        "max_model_len": Arg(bad_dtype=float, device=False, needs=lambda c: c.compress_ratio == 128,
                             ranges={"range-low": _set("max_model_len", lambda v, i: 0)}),
    }
    out = [Entry("dsv4_step.build_layer_metadata", fds.BuilderCase, _builder_cases, _build_layer,
                 {**_layer_tensor_args(), **scalars})]
    for method in ("build", "build_for_cudagraph_capture"):
        out.append(Entry(f"dsv4_step.Dsv4MetadataBuilder.{method}", fds.BuilderCase, _builder_cases, _build_builder,
                         _layer_tensor_args()))
    return out


def _assembly_cases(target=None):
    return fpa.assembly_cases()


def _build_assembly(c, device, target) -> dict:
    ch = fpa.build_assembly_inputs(c, device).chunks[0]
    return {"topk_indices": ch.topk_indices, "query_start_loc": ch.query_start_loc, "seq_lens": ch.seq_lens,
            "gather_lens": ch.gather_lens, "compress_ratio": c.ratio, "M": ch.M, "N": ch.N, "topk": c.topk,
            "window_size": c.window, **ch.image_kwargs(c)}


def _chunk_req(inner, inputs, rng):
    """A request of the first chunk with query tokens."""
    qsl = inputs["query_start_loc"].tolist()
    live = [r for r in range(len(qsl) - 1) if qsl[r + 1] > qsl[r]]
    return rng.choice(live) if live else None


def _slack_req(inner, inputs, rng):
    """A request with query tokens whose gather one past its seq_len the workspace still holds (N + seq_len + 1
    <= M), so that only the gather check stands between it and the launch; None when the chunk has none."""
    qsl, seqs = inputs["query_start_loc"].tolist(), inputs["seq_lens"].tolist()
    room = inputs["M"] - inputs["N"]
    live = [r for r in range(len(qsl) - 1) if qsl[r + 1] > qsl[r] and seqs[r] + 1 <= room]
    return rng.choice(live) if live else None


def _assembly_plain() -> fpa.AssemblyCase:
    """Two requests in a workspace with room: a gather past a seq_len passes the workspace check."""
    return fpa.AssemblyCase(seed=3, ratio=4, topk=2, topk_extra=0, window=3, seq_lens=(9, 3), query_lens=(2, 2),
                            replay_cut=(1000, 1000), max_model_len=16, max_num_batched_tokens=8, invalid_rate=0.0,
                            int32_extremes=False, topk_dtype="int32", topk_3d=False, topk_layout="contiguous",
                            qsl_base=0, workspace=(4, 16))


def _qlen(inputs, r) -> int:
    qsl = inputs["query_start_loc"]
    return int(qsl[r + 1]) - int(qsl[r])


def _assembly_entry() -> Entry:
    images = lambda c: c.max_image_tokens > 0 or bool(c.image_spans)  # noqa: E731
    visible = lambda n: Arg(dims=(0,), bad_dtype=torch.float32, partners=("topk_indices",), needs=images,  # noqa
                            ranges={"range-low": _entry_at(n, lambda c, i, r: r.randrange(i[n].numel()) if
                                                           i[n].numel() else None, lambda t, i, inp: -1,
                                                           "a negative count")})
    return Entry("prefill_assembly.combine_topk_swa_indices", fpa.AssemblyCase, _assembly_cases, _build_assembly, {
        "topk_indices": Arg(dims=(0,), bad_dtype=torch.float32, partners=("query_start_loc",)),
        "query_start_loc": Arg(dims=(0,), bad_dtype=torch.float32, partners=("seq_lens", "topk_indices"), ranges={
            "range-high": _entry_at("query_start_loc", lambda c, i, r: i["query_start_loc"].numel() - 1,
                                    lambda t, i, inp: int(t[i]) + 1, "one token past topk_indices' rows")}),
        "seq_lens": Arg(dims=(0,), bad_dtype=torch.float32, partners=("query_start_loc", "gather_lens"), ranges={
            "range-low": _entry_at("seq_lens", _chunk_req, lambda t, i, inp: _qlen(inp, i) - 1,
                                   "one short of the request's query tokens")}),
        "gather_lens": Arg(dims=(0,), bad_dtype=torch.float32, partners=("seq_lens",), ranges={
            "range-high": _entry_at("gather_lens", _slack_req, lambda t, i, inp: int(inp["seq_lens"][i]) + 1,
                                    "one past the request's seq_len"),
            "range-low": _entry_at("gather_lens", _chunk_req, lambda t, i, inp: _qlen(inp, i) - 1,
                                   "one short of the request's query tokens")}),
        "M": Arg(bad_dtype=float, device=False, partners=("gather_lens", "N"), ranges={
            "range-low": _set("M", lambda v, i: i["N"] + int(i["gather_lens"].max()) - 1,
                              "; one short of N + the longest gather")}),
        "left_visible": visible("left_visible"),
        "right_visible": visible("right_visible"),
    }, _assembly_plain)


def _reduce_cases(target=None):
    return fdr.reduce_cases().filter(lambda c: not any(fdr.refusable(c).values()))


def _build_reduce(c, device, target) -> dict:
    p = fdr.build_partials(c)
    kw = {f"workspace.{k}": fdr.lay_out(p[k], c.ws_layout, device) for k in ("part_m", "part_l", "part_acc")}
    kw["attn_sink"] = fdr.lay_out(p["sink"].float(), c.sink_layout, device) if p["sink"] is not None else None
    out = torch.full((c.batch, c.heads, fdr.HEAD_DIM), float("nan"), dtype=torch.bfloat16)
    return {**kw, "out": fdr.lay_out(out, c.out_layout, device), "adaptive": c.adaptive}


def _call_reduce(fn, kw: dict):
    import sys

    ws = sys.modules[fn.__module__].DecodeWorkspace(*(kw.pop(f"workspace.{k}") for k in ("part_m", "part_l",
                                                                                          "part_acc")))
    return fn(ws, **kw)


def _reduce_entry() -> Entry:
    parts = ("workspace.part_m", "workspace.part_l", "workspace.part_acc")
    part = lambda n, dims: Arg(dims=dims, contiguous=True, bad_dtype=torch.float16,  # noqa: E731
                               partners=tuple(p for p in parts if p != n))
    return Entry("decode.decode_reduce", fdr.ReduceCase, _reduce_cases, _build_reduce, {
        "workspace.part_m": part("workspace.part_m", (0, 1, 2)),
        "workspace.part_l": part("workspace.part_l", (0, 1, 2)),
        "workspace.part_acc": part("workspace.part_acc", (0, 1, 2, 3)),
        "attn_sink": Arg(contiguous=True, bad_dtype=torch.bfloat16, needs=lambda c: c.sink != "none"),
        "out": Arg(dims=(0, 1, 2), contiguous=True, bad_dtype=torch.float32, partners=parts),
    }, call=_call_reduce)


def _graph_cases(target=None):
    return fgc.graph_replay_cases(target, max_batch=2, max_heads=2, max_row=3)  # small: the replay captures once


def _build_capture(c, device, target) -> dict:
    inp = fgc.build_graph_case(c, target, device)
    cap = fgc.build_step(c, c.capture, 0, inp, device)
    kw = {"q": cap.q, "main_cache": inp.main.view, "main_indices": cap.main_indices,
          "main_indptr": cap.main_indptr, "max_per_row_main": c.max_main, "compress_ratio": c.compress_ratio,
          "attn_sink": inp.attn_sink, "softmax_scale": inp.softmax_scale, "cu_count": c.cu_count,
          "mode": "emulate"}
    if inp.extra is not None:
        kw.update(extra_cache=inp.extra.view, extra_indices=cap.extra_indices, extra_indptr=cap.extra_indptr,
                  max_per_row_extra=c.max_extra)
    return kw


_GRAPHS: dict = {}


def _build_replay(c, device, target) -> dict:
    """A graph captured at the case's capture step (once per case, device and target: the capture runs the
    decode) and the case's first replay step as keywords, ``self`` the graph."""
    from impl.graph_capture import DecodeGraph

    key = (repr(c), str(device), getattr(target, "name", target))
    if key not in _GRAPHS:
        kw = _build_capture(c, device, target)
        _GRAPHS[key] = (DecodeGraph.capture(**kw, target=target), fgc.build_graph_case(c, target, device))
    g, inp = _GRAPHS[key]
    step = fgc.build_step(c, (c.replays or (c.capture,))[0], 1, inp, device)
    kw = {"self": g, "q": step.q, "main_indices": step.main_indices, "main_indptr": step.main_indptr}
    if step.extra_indices is not None:
        kw.update(extra_indices=step.extra_indices, extra_indptr=step.extra_indptr)
    return kw


def _ragged_pair(prefix: str, needs=None) -> dict:
    return {f"{prefix}_indices": Arg(bad_dtype=torch.int64, needs=needs),
            f"{prefix}_indptr": Arg(dims=(0,), bad_dtype=torch.int64, partners=("q",), needs=needs, ranges={
                "range-high": _indptr_range(f"{prefix}_indptr", f"{prefix}_indices", True),
                "range-low": _indptr_range(f"{prefix}_indptr", f"{prefix}_indices", False)})}


def _graph_entries() -> list[Entry]:
    extra = lambda c: c.max_extra is not None  # noqa: E731
    cache = lambda needs=None: Arg(dims=(2,), bad_dtype=torch.int8, needs=needs)  # noqa: E731
    return [
        Entry("graph_capture.DecodeGraph.capture", fgc.GraphCase, _graph_cases, _build_capture, {
            "q": Arg(dims=(2,), bad_dtype=torch.float32),
            "main_cache": cache(), **_ragged_pair("main"),
            "extra_cache": cache(extra), **_ragged_pair("extra", extra),
            "attn_sink": Arg(contiguous=True, bad_dtype=torch.bfloat16, needs=lambda c: c.sink != "none"),
        }, valid=lambda c: not fgc.refusable(c)),  # a sink layout the capture may refuse is no valid call to break
        # a replay of fewer rows than captured is legal (the rest run empty): q's row count is free below it
        # a compressed layer's graph carries every argument (the extra segment too): one capture per row
        Entry("graph_capture.DecodeGraph.replay", fgc.GraphCase,
              lambda t=None: _graph_cases(t).filter(lambda c: c.max_extra is not None), _build_replay, {
            "q": Arg(dims=(1, 2), bad_dtype=torch.float32),
            **_ragged_pair("main"), **_ragged_pair("extra", extra),
        }, shared=("self",), valid=lambda c: not fgc.refusable(c)),  # its graph is captured from the same case
    ]


def _build_consumer(c, device, target) -> dict:
    """The partition the builder computes for the case's last step, consumed over random rows: q padded to the
    builder's heads, a bf16 kv pool, flat slot ids (-1 holes among them) and an output of NaN. Only the step's
    first request is built (the consumer runs its items on the host, one by one: a small partition keeps it cheap)."""
    last = c.steps[-1]
    c = c.replace(steps=(last.replace(q_lens=last.q_lens[:1], seq_lens=last.seq_lens[:1], pad=0),))
    kw = _build_metadata(c, device, target)
    b = kw.pop("self")
    md = _call_metadata(type(b).build, {"self": b, **kw})
    g = torch.Generator().manual_seed(c.steps[-1].seed)
    T, H, slots = md.num_tokens, md.num_heads, 9
    ids = torch.randint(-1, slots, (max(1, T * b.topk_tokens),), generator=g, dtype=torch.int32)
    return {"q": torch.randn(T, H, 576, generator=g).to(torch.bfloat16).to(device),
            "kv_cache": torch.randn(slots, 576, generator=g).to(torch.bfloat16).to(device),
            "kv_indices": ids.to(device), "partition": {k: v.clone() for k, v in b.partition.items()},
            "softmax_scale": 0.07, "kv_lora_rank": 512,
            "out": torch.full((T, H, 512), float("nan"), dtype=torch.bfloat16, device=device)}


def _read_slot_high(inputs, inner, rng):
    """A slot id one past kv_cache's rows at an entry a work item reads."""
    p = inputs["partition"]
    n = int(p["work_meta"][0])
    read = sorted({i for _, b, e, _ in p["work_info"][:n].tolist() for i in range(b, e)})
    if not read:
        return None
    i = rng.choice(read)
    ids = inputs["kv_indices"].clone()
    ids[i] = inputs["kv_cache"].shape[0]
    inputs["kv_indices"] = ids
    return f"kv_indices[{i}] = {int(ids[i])} (kv_cache has {inputs['kv_cache'].shape[0]} rows; an item reads it)"


def _consumer_entry() -> Entry:
    return Entry("work_partition.sparse_decode_from_partition", fsm.MetadataCase, _metadata_cases, _build_consumer, {
        # q's device is the call's: moving q alone is reported against the others
        "q": Arg(dims=(2,), bad_dtype=torch.int32, device=False, partners=("kv_cache", "out")),
        "kv_cache": Arg(dims=(1,), bad_dtype=torch.int8, partners=("q",)),
        "kv_indices": Arg(bad_dtype=torch.float32, ranges={"range-high": _read_slot_high}),
        "out": Arg(dims=(0, 1, 2), bad_dtype=torch.float32, partners=("q", "kv_lora_rank")),
        "kv_lora_rank": Arg(bad_dtype=float, device=False, ranges={
            "range-high": _set("kv_lora_rank", lambda v, i: int(i["q"].shape[2]) + 1, "; wider than q"),
            "range-low": _set("kv_lora_rank", lambda v, i: 0)}),
    })


def _build_prefill_launch(c, device, target) -> dict:
    """The launcher's arguments as ``sparse_attn_prefill`` hands them over (kv [skv, d], dense rows [sq, k], the
    sink cut to the heads, out allocated)."""
    from impl.prefill import DEFAULT_ROPE_DIM

    inp = fpre.build_prefill_inputs(c, device)
    kv2 = inp.kv[:, 0, :] if inp.kv.dim() == 3 else inp.kv
    idx = inp.indices[:, 0, :] if inp.indptr is None and inp.indices.dim() == 3 else inp.indices
    h = int(inp.q.shape[1])
    return {"q": inp.q, "kv2": kv2, "indices": idx, "indptr": inp.indptr, "softmax_scale": inp.softmax_scale,
            "attn_sink": inp.attn_sink[:h] if inp.attn_sink is not None else None,
            "out": inp.out if inp.out is not None else torch.empty_like(inp.q), "rope_head_dim": DEFAULT_ROPE_DIM,
            "topk_length": inp.topk_length}


def _prefill_launch_entry() -> Entry:
    ragged = lambda c: c.mode == "ragged"  # noqa: E731
    return Entry("prefill.sparse_attn_prefill_triton", fpre.PrefillCase, lambda t=None: fpre.prefill_cases(),
                 _build_prefill_launch, {
                     "q": Arg(dims=(0, 2), bad_dtype=torch.float32,
                              partners=("kv2", "indices", "indptr", "topk_length", "out")),
                     "kv2": Arg(dims=(1,), bad_dtype=torch.float32, partners=("q",)),
                     "indices": Arg(bad_dtype=torch.float32),
                     "indptr": Arg(dims=(0,), contiguous=True, bad_dtype=torch.int64, partners=("q",),
                                   needs=ragged),
                     "topk_length": Arg(dims=(0,), bad_dtype=torch.float32, partners=("q",),
                                        needs=lambda c: c.mode == "dense" and c.topk_given),
                     "attn_sink": Arg(contiguous=True, bad_dtype=torch.bfloat16, needs=lambda c: c.sink != "none"),
                     "out": Arg(dims=(0, 1), bad_dtype=torch.int32, partners=("q",)),
                     "rope_head_dim": Arg(bad_dtype=float, device=False, ranges={
                         "range-high": _set("rope_head_dim", lambda v, i: int(i["q"].shape[2]), "; all of d"),
                         "range-low": _set("rope_head_dim", lambda v, i: -1)}),
                 }, valid=lambda c: not fpre.refusable(c))  # layouts the prefill may refuse: no valid call


def _build_fill(c, device, target) -> dict:
    """A builder after ``build`` of the case's last step, its metadata, and top-k rows of request-local positions
    inside each token's context (-1 past its sparse length). ``validate=True``: the entry's refusing mode; its
    default checks the positions only on the host (on an accelerator it skips the check to spare a sync, and an
    out-of-range position faults in the gather: the caller's contract there)."""
    kw = _build_metadata(c, device, target)
    b = kw["self"]
    md = _call_metadata(type(b).build, dict(kw))
    rng = random.Random(c.steps[-1].seed)
    K, rows = b.topk_tokens, []
    for ctx in md.context_positions.tolist():
        n = min(K, ctx + 1) if ctx >= 0 else 0
        rows.append(rng.sample(range(ctx + 1), n) + [-1] * (K - n))
    return {"self": b, "metadata": md, "topk_indices": torch.tensor(rows, dtype=torch.int32, device=device),
            "validate": True}


def _fill_position(high: bool):
    """A top-k entry one past the token's context (high) or below the hole marker -1 (low)."""
    def fn(inputs, inner, rng):
        rows = inputs["topk_indices"].clone()
        ctx = inputs["metadata"].context_positions
        t = rng.randrange(rows.shape[0])
        v = max(int(ctx[t]) + 1, 0) if high else -2
        rows[t, 0] = v
        inputs["topk_indices"] = rows
        return f"topk_indices[{t}, 0] = {v} (token {t}'s context ends at position {int(ctx[t])})"
    return fn


def _fill_entry() -> Entry:
    return Entry("sparse_metadata.SparseMLAMetadataBuilder.fill_global_indices", fsm.MetadataCase, _metadata_cases,
                 _build_fill, {
                     # rows past the step's tokens are legal (a persistent top-k buffer): dimension 0 is free above
                     "topk_indices": Arg(dims=(1,), bad_dtype=torch.float32, ranges={
                         "range-high": _fill_position(True), "range-low": _fill_position(False)}),
                 })


def _topk_decode_cases(target=None):
    return fil.decode_cases()


def _topk_prefill_cases(target=None):
    return fil.prefill_cases()


def _logits(c, rows: int, width: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(c.seed)
    x = torch.randn(rows, width, generator=g)
    x[torch.rand(rows, width, generator=g) < 0.2] = float("-inf")  # not candidates
    return x.to(device)


def _build_topk(c, device, target) -> dict:
    rows = len(c.context_lens) if c.per_row else c.batch * c.next_n
    return {"logits": _logits(c, rows, c.max_model_len, device), "k": c.topk,
            "out": torch.full((rows, c.topk), -7, dtype=torch.int32, device=device)}


def _build_topk_prefill(c, device, target) -> dict:
    T = len(c.row_starts)
    return {"logits": _logits(c, T, c.keys, device), "k": c.topk,
            "ks": torch.tensor(c.row_starts, dtype=torch.int32, device=device),
            "ke": torch.tensor(c.row_ends, dtype=torch.int32, device=device),
            "out": torch.full((T, c.topk), -7, dtype=torch.int32, device=device)}


def _topk_entries() -> list[Entry]:
    common = {
        "logits": Arg(bad_dtype=torch.float16),
        "out": Arg(dims=(0, 1), bad_dtype=torch.int64, partners=("logits", "k")),
        "k": Arg(bad_dtype=float, device=False, ranges={"range-low": _set("k", lambda v, i: 0)}),
    }
    bound = lambda n, high: _entry_at(n, lambda c, i, r: r.randrange(i[n].numel()),  # noqa: E731
                                      (lambda t, i, inp: int(inp["logits"].shape[1]) + 1) if high else
                                      (lambda t, i, inp: -1), "columns of logits: [0, width]")
    return [
        Entry("indexer_logits.topk_indices", fil.IndexerLogitsCase, _topk_decode_cases, _build_topk, common),
        Entry("indexer_logits.topk_indices_prefill", fil.IndexerLogitsCase, _topk_prefill_cases,
              _build_topk_prefill, {
                  **common,
                  "ks": Arg(dims=(0,), bad_dtype=torch.float32, partners=("logits",),
                            ranges={"range-low": bound("ks", False)}),
                  "ke": Arg(dims=(0,), bad_dtype=torch.float32, partners=("logits",),
                            ranges={"range-high": bound("ke", True)}),
              }),
    ]


def _build_epilogue(c, device, target) -> dict:
    x, cos_sin, positions = fep.rope_input(c, device)
    return {"out": x, "cos_sin": cos_sin, "positions": positions, "mxfp8": c.width % 32 == 0,
            "rotated": torch.zeros_like(x)}


def _epilogue_entry() -> Entry:
    return Entry("dsv4_step.step_epilogue", fep.RopeCase, lambda t=None: fep.rope_cases(), _build_epilogue, {
        "out": Arg(dims=(0,), contiguous=True, bad_dtype=torch.float16, partners=("positions",)),
        "cos_sin": Arg(dims=(1,), contiguous=True, bad_dtype=torch.float64),
        # a padding token's position -1 is legal here (rotated at 0 and discarded): only the high end is bounded
        "positions": Arg(dims=(0,), bad_dtype=torch.float32, partners=("out", "x"),
                         ranges={"range-high": _position_range(True)}),
        "rotated": Arg(dims=(0, 1, 2), contiguous=True, bad_dtype=torch.int32, partners=("out", "x"),
                       overlaps="out"),
        "mxfp8": Arg(bad_dtype=int, device=False),
    })


def _swa_cases(target=None):
    return fcw.swa_cases()


def _compressor_cases(target=None):
    return fcw.compressor_cases()


def _indexer_compressor_cases(target=None):
    return fiw.compressor_cases()


ENTRIES: dict[str, Entry] = {e.name: e for e in (
    Entry("formats.pack_fp8_ds_mla", LayoutCase, _fp8_layout_cases, _build_pack, {
        **_FORMAT_READ_ARGS,
        "nope_codes": Arg(dims=(0, 1), bad_dtype=torch.int8, device=False, partners=("slots",)),
        "scale_codes": Arg(dims=(0, 1), bad_dtype=torch.int8, device=False, partners=("slots",)),
        "rope": Arg(dims=(0, 1), bad_dtype=torch.float16, device=False, partners=("slots",)),
    }, _layout_plain),
    Entry("formats.unpack_fp8_ds_mla", LayoutCase, _fp8_layout_cases, _build_unpack, _FORMAT_READ_ARGS,
          _layout_plain),
    Entry("formats.dequantize_fp8_ds_mla", LayoutCase, _fp8_layout_cases, _build_dequant, _FORMAT_READ_ARGS,
          _layout_plain),
    Entry("cache_writers.quantize_and_insert_k_cache", fcw.SwaCase, _swa_cases, _build_swa, {
        "k": Arg(dims=(0, 1), contiguous=True, bad_dtype=torch.float32, partners=("slot_mapping",)),
        "slot_mapping": Arg(dims=(0,), bad_dtype=torch.int32, partners=("k",),
                            ranges=_slot_range(_cache_slots, _swa_writing, -2),
                            uses=lambda c: bool(_swa_writing(c))),
        "cache": Arg(dims=(2,), bad_dtype=torch.int8),
    }, _swa_plain),
    Entry("compressor.compress_norm_rope_store", fcw.CompressorCase, _compressor_cases, _build_compressor,
          {**_window_args(("positions",), -2), "splits": _splits_arg()}, _compressor_plain),
    Entry("indexer_writer.indexer_k_quant_and_cache", fiw.DirectCase, _direct_cases, _build_direct, {
        "k": Arg(dims=(0, 1), contiguous=True, bad_dtype=torch.float16, partners=("slot_mapping",)),
        "slot_mapping": Arg(dims=(0,), bad_dtype=torch.int32, partners=("k",),
                            ranges=_slot_range(_cache_slots, lambda c: [t for t, s in enumerate(c.slots) if s >= 0],
                                               None),
                            uses=lambda c: any(s >= 0 for s in c.slots)),
        "cache": Arg(dims=(2,), bad_dtype=torch.int8),
    }, _direct_plain),
    Entry("indexer_writer.compress_norm_rope_store_indexer", fiw.IndexerCompressorCase, _indexer_compressor_cases,
          _build_indexer_compressor,
          # the cache's tokens back to back (FP8 132 B, MXFP4 68 B records): a padded view is refused
          {**_window_args(("positions",), None), "cache": Arg(dims=(2,), bad_dtype=torch.int8, packed_rows=True)},
          _indexer_compressor_plain),
    *_more_entries(),
)}


# --- strategy and declared dimensions ----------------------------------------------------------------------------

def seeded_draw(strategy, seed: int):
    """One case of ``strategy`` drawn from a ``Random(seed)`` (Hypothesis' own draw, no search, no shrinking): the
    covering rows of this family get valid calls from each entry point's own generator, reproducibly."""
    from hypothesis.control import BuildContext
    from hypothesis.errors import StopTest
    from hypothesis.internal.conjecture.data import ConjectureData

    data = ConjectureData(random=random.Random(seed))
    try:
        with BuildContext(data, is_final=False, wrapped_test=None):
            return data.draw(strategy)
    except StopTest:  # this draw ran past its choice budget (or a filter gave up): no case from this seed
        raise LookupError(f"no case drawn from seed {seed}") from None


def carries(entry: Entry, inner, arg: str, breakage: str, target, seed: int = 0) -> bool:
    """Can the valid call ``inner`` carry the breakage (the argument passed, a token that uses the id, a
    dimension that is not empty)? Built once on the device the kernels run on (an entry point that launches, e.g. a
    graph capture, refuses a host tensor there) and broken once to see."""
    spec = entry.args[arg]
    if entry.valid is not None and not entry.valid(inner):
        return False
    if spec.needs is not None and not spec.needs(inner):
        return False
    if breakage in ID_BREAKAGES and spec.uses is not None and not spec.uses(inner):
        return False
    try:
        # a shallow copy is enough: a breakage replaces an argument (a clone, a view, a new tensor) and never
        # writes into the one it replaces
        break_inputs(entry.name, arg, breakage, seed, dict(_built(entry, inner, kernel_device(), target)), inner)
    except LookupError:
        return False
    return True


_BUILT: dict = {}


def build_call(entry: Entry, inner, device, target) -> dict:
    """``entry.build(inner, device, target)``, built once per valid call and handed out as a deep copy (views
    keep sharing their pools; an object argument's buffers are copied with it): every breakage starts from a
    fresh copy of the same call."""
    built = _built(entry, inner, device, target)
    return copy.deepcopy(built, {id(built[n]): built[n] for n in entry.shared if n in built})


def _built(entry: Entry, inner, device, target) -> dict:
    """The one build of a valid call (read only: breakages replace arguments, never write into them)."""
    key = (entry.name, repr(inner), str(device), getattr(target, "name", target))
    if key not in _BUILT:
        if len(_BUILT) >= 64:
            _BUILT.clear()
        _BUILT[key] = entry.build(inner, device, target)
    return _BUILT[key]


#: seeded draws tried for a valid call that carries a breakage, before the entry's plain call
DRAW_TRIES = 12


_FOUND: dict = {}


def find_inner(entry: Entry, arg: str, breakage: str, seed: int, target):
    """A valid call of ``entry`` that carries ``arg: breakage``: a seeded draw of its generator (``seed``,
    ``seed + 1``, ...), else its plain call; None when neither does. Remembered per process (cases are immutable)."""
    key = (entry.name, arg, breakage, seed, getattr(target, "name", target))
    if key not in _FOUND:
        _FOUND[key] = _search_inner(entry, arg, breakage, seed, target)
    return _FOUND[key]


def _search_inner(entry: Entry, arg: str, breakage: str, seed: int, target):
    for k in range(DRAW_TRIES):
        try:
            inner = seeded_draw(entry.strategy(target), seed + k)
        except Exception:  # noqa: BLE001 - a draw the generator rejects (or a Hypothesis without this API)
            continue
        if carries(entry, inner, arg, breakage, target, seed):
            return inner
    plain = entry.plain() if entry.plain is not None else None
    return plain if plain is not None and carries(entry, plain, arg, breakage, target, seed) else None


def valid_draw(entry: Entry, seed: int, target):
    """A valid call of ``entry`` drawn by its generator from ``seed`` (then ``seed + 1``, ...); None if none."""
    for k in range(DRAW_TRIES):
        try:
            inner = seeded_draw(entry.strategy(target), seed + k)
        except Exception:  # noqa: BLE001 - a draw the generator rejects (or a Hypothesis without this API)
            continue
        if entry.valid is None or entry.valid(inner):
            return inner
    return None


def bad_input_cases(target):
    @st.composite
    def build(draw) -> BadInputCase:
        entry = ENTRIES[draw(st.sampled_from(sorted(ENTRIES)))]
        inner = draw(entry.strategy(target))
        seed = draw(st.integers(0, 2 ** 31 - 1))
        if entry.valid is not None and not entry.valid(inner):
            inner = valid_draw(entry, seed, target)
        return BadInputCase(entry=entry.name, inner=None if inner is None else inner.to_json(), seed=seed)

    return build()


def classify_bad_input(case: BadInputCase, target=None) -> dict:
    return {"entry": case.entry}


def force_bad_input(case: BadInputCase, combo: dict, target=None) -> BadInputCase:
    """``case`` as a case of the combo's entry point: its drawn valid call kept when it is that entry's, else one
    drawn from that entry's generator with the case's seed."""
    name = combo.get("entry", case.entry)
    if name == case.entry and case.inner is not None:
        return case.replace(arg=None, breakage=None)
    inner = valid_draw(ENTRIES[name], case.seed, target)
    return BadInputCase(entry=name, inner=None if inner is None else inner.to_json(), seed=case.seed)


def _examples(target=None) -> list[BadInputCase]:
    """Pinned cases (the valid call found from the seed when checked): the two breakages issue 30's surviving
    mutants let through - an fp8_ds_mla cache view one byte narrower per token (strides of the 584-byte cache), and
    a writing token's request id one past the indexer compressor's state table - and the MXFP4 indexer cache
    with its tokens padded apart, which a block check that refuses only when both of its strides are wrong lets
    through."""
    return [BadInputCase(entry="formats.pack_fp8_ds_mla", arg="cache", breakage="dim2-small"),
            BadInputCase(entry="indexer_writer.compress_norm_rope_store_indexer", arg="token_to_req",
                         breakage="range-high"),
            # the MXFP4 indexer cache with its 68-byte tokens padded apart (each token unit-strided): its block
            # check must refuse a token stride other than 68 on its own
            BadInputCase(entry="indexer_writer.compress_norm_rope_store_indexer", arg="cache", breakage="padded",
                         inner=_indexer_compressor_plain().replace(kv_format="mxfp4").to_json()),
            # zero splits of a two-stage compressor call: refused by the splits check, not by a division by zero
            BadInputCase(entry="compressor.compress_norm_rope_store", arg="splits", breakage="range-low",
                         inner=_two_stage_plain().to_json())]


#: one dimension: the entry point. Each case checks every argument x breakage of its entry point (exhaustive
#: within the case), so ``ci``'s covering rows - one per entry point - reach every pair of the two
BAD_INPUT_DIMENSIONS = declare(Family(
    "bad-input",
    (Dimension("entry", tuple(sorted(ENTRIES)), "the entry point (family.function) whose arguments are broken"),),
    (), classify_bad_input, force_bad_input, None, _examples,
), "bad-input-refusal")
