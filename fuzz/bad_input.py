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
the skip value where only -1 skips, or negative where no entry may skip). The contract calls the broken case and
expects a ``ValueError`` / ``TypeError`` naming the argument before any launch, every buffer untouched.

A case is one entry point's valid call; its check runs every breakage of every argument of that entry in turn
(each on a fresh copy of the call, or on another valid call drawn from the case's seed where this one cannot carry
it: no token that writes, an optional argument not passed). Declared dimension: ``entry``, so ``ci``'s covering
rows reach every entry point, and with it every argument x breakage pair.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from hypothesis import strategies as st

from fuzz import cache_writers as fcw
from fuzz import cp_gather as fcg
from fuzz import decode as fdec
from fuzz import epilogues as fep
from fuzz import graph_buffers as fgb
from fuzz import indexer_logits as fil
from fuzz import indexer_writer as fiw
from fuzz import prefill as fpre
from fuzz import ragged as frg
from fuzz import router as frt
from fuzz.cases import Case, _freeze
from fuzz.dimensions import Dimension, Family, declare
from fuzz.formats import Fp8Case, LayoutCase, Ue8m0Case, fp8_cases, layout_cases, ue8m0_cases

DIM_BREAKAGES = tuple(f"dim{d}-{s}" for d in range(4) for s in ("small", "large"))
RANGE_BREAKAGES = ("range-high", "range-low")
BREAKAGES = DIM_BREAKAGES + ("dtype", "device", "noncontig") + RANGE_BREAKAGES
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

    def breakages(self) -> tuple[str, ...]:
        out = [f"dim{d}-{s}" for d in self.dims for s in ("small", "large")]
        out += ["dtype"] if self.bad_dtype is not None else []
        out += ["device"] if self.device else []
        out += ["noncontig"] if self.contiguous else []
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
    if t.dim() == 0 or t.shape[-1] <= 1:
        raise LookupError(f"{arg}: a last dimension of {t.shape[-1] if t.dim() else 0} elements has no stride to break")
    inputs[arg] = _strided(t)
    return f"{arg} strides {list(t.stride())} -> {list(inputs[arg].stride())}"


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
    return {**fcw.build_compressor_inputs(c, device), "cache": cache, "ratio": c.ratio}


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


def _build_gather(c, device, target) -> dict:
    kw = fcg.build_gather_inputs(c, device)
    kw.pop("pool")
    return kw


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
    return {"x": x, "cos_sin": cos_sin, "positions": positions}


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
        }),
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
        }),
        Entry("epilogues.mxfp8_quantize", fep.Mxfp8Case, lambda t=None: fep.mxfp8_cases(), _build_mxfp8, {
            "x": Arg(dims=(1,), contiguous=True, bad_dtype=torch.float16),
        }),
        Entry("router.biased_grouped_topk", frt.RouterCase, lambda t=None: frt.router_cases(), _build_router, {
            "gating_output": Arg(bad_dtype=torch.int32, device=False),
            "correction_bias": Arg(dims=(0,), bad_dtype=torch.int32, partners=("gating_output",)),
        }),
    ]
    out += _logits_entries() + [_graph_entry()] + _indexer_format_entries()
    for name, (ctype, strat, build, arg, bad) in _codec_builds().items():
        out.append(Entry(name, ctype, strat, build, {arg: Arg(bad_dtype=bad, device=False)}))
    return out


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
          _window_args(("positions",), -2), _compressor_plain),
    Entry("indexer_writer.indexer_k_quant_and_cache", fiw.DirectCase, _direct_cases, _build_direct, {
        "k": Arg(dims=(0, 1), contiguous=True, bad_dtype=torch.float16, partners=("slot_mapping",)),
        "slot_mapping": Arg(dims=(0,), bad_dtype=torch.int32, partners=("k",),
                            ranges=_slot_range(_cache_slots, lambda c: [t for t, s in enumerate(c.slots) if s >= 0],
                                               None),
                            uses=lambda c: any(s >= 0 for s in c.slots)),
        "cache": Arg(dims=(2,), bad_dtype=torch.int8),
    }, _direct_plain),
    Entry("indexer_writer.compress_norm_rope_store_indexer", fiw.IndexerCompressorCase, _indexer_compressor_cases,
          _build_indexer_compressor, _window_args(("positions",), None), _indexer_compressor_plain),
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
    dimension that is not empty)? Built on the CPU and broken once to see."""
    spec = entry.args[arg]
    if entry.valid is not None and not entry.valid(inner):
        return False
    if spec.needs is not None and not spec.needs(inner):
        return False
    if breakage in ID_BREAKAGES and spec.uses is not None and not spec.uses(inner):
        return False
    try:
        break_inputs(entry.name, arg, breakage, seed, entry.build(inner, "cpu", target), inner)
    except LookupError:
        return False
    return True


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
    a writing token's request id one past the indexer compressor's state table."""
    return [BadInputCase(entry="formats.pack_fp8_ds_mla", arg="cache", breakage="dim2-small"),
            BadInputCase(entry="indexer_writer.compress_norm_rope_store_indexer", arg="token_to_req",
                         breakage="range-high")]


#: one dimension: the entry point. Each case checks every argument x breakage of its entry point (exhaustive
#: within the case), so ``ci``'s covering rows - one per entry point - reach every pair of the two
BAD_INPUT_DIMENSIONS = declare(Family(
    "bad-input",
    (Dimension("entry", tuple(sorted(ENTRIES)), "the entry point (family.function) whose arguments are broken"),),
    (), classify_bad_input, force_bad_input, None, _examples,
), "bad-input-refusal")
