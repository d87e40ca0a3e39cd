"""Graph capture: upstream's sparse decode captured and replayed the way vLLM's FULL decode graphs run it.

Upstream has no capture object of its own; a captured decode step is the sum of four pieces of its code, and the
adapter's ``DecodeGraph`` (our API: ``capture`` / ``replay``) runs exactly those:

- **the capture flag**: ``DeepseekV4ROCMAiterMLASparseMetadataBuilder.build_for_cudagraph_capture`` (rocm.py), run
  on a builder whose parent (a stand-in) hands back a plain metadata object; the flag it sets is read off that
  object;
- **adaptive splits**: ``DeepseekV4ROCMAiterMLAAttention.forward_mqa`` (rocm.py), run on a stand-in layer whose
  ``_forward_decode`` records the ``adaptive_splits`` it is given (upstream decides it there, from the arch, the
  layer's compress ratio and the capture flag); the trust gate is upstream's ``_trust_dsv4_extra_cache_nan_free``
  with the arguments ``_forward_decode`` gives it;
- **the persistent buffers**: every step's ragged segments go through upstream's ``_copy_ragged_to_graph_buffers``
  into buffers of ``num_rows * max_per_row`` (indices) and ``num_rows + 1`` (indptr) entries, as the builders'
  persistent buffers are sized; a replay with fewer rows than captured is padded with empty rows, as vLLM pads a
  decode batch to the captured size;
- **the launches**: upstream's decode wrapper ``rocm_sparse_attn_decode`` (called as the decode adapter calls it,
  ragged segments as ``swa_ragged_*`` / ``topk_ragged_*``, the CU count pinned) on the persistent q and output
  buffers and the views the capture's copy returned.

For C4A layers (compress ratio 4) upstream builds the extra segment inside the decode from the indexer's top-k
rather than copying it into a graph buffer; our API hands the segment in, so it takes the same copy as C128A's.

Modes (as ours): ``"cuda"`` (native Triton and a GPU torch can capture on) wraps the wrapper call in a real
``torch.cuda.CUDAGraph``; ``"emulate"`` (the Triton interpreter) records every kernel launch of the capture run
through an observer around upstream's kernel objects (the decode adapter's launch proxies), and each replay runs
the wrapper again with an observer that compares every launch with the captured one *before* it runs. Pointers into
a persistent buffer (q, output, index buffers, caches, sink) must be equal; a tensor the wrapper allocates itself
(the split-K partials, a staging output) is where a real graph's private pool would keep it, so it is compared by
its place in the allocation order, its layout and dtype. Any difference raises :class:`GraphReplayError`; a real
graph would silently keep the captured values.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from unittest import mock

import torch

from contracts.subjects.base import Family
from contracts.subjects.vllm.adapters.decode import (DEFAULT_SCALE, _call_public, _Launches,
                                                      _native_fnuz_unavailable, plan_from_launches)
from contracts.subjects.vllm.adapters.graph_buffers import same_target
from contracts.subjects.vllm.adapters.splits import pinned_cu
from contracts.subjects.vllm.adapters import aiter_flags_off, needs
from impl import formats
from impl.decode import LaunchRecord, TensorArg
from impl.graph_capture import describe_launch_diff
from impl.runtime import triton_mode
from impl.targets import effective_cu_count
from impl.validation import dtype_name

MODES = ("cuda", "emulate")
HEAD_WIDTH = formats.DSV4_HEAD_DIM
SWA_ONLY_RATIOS = (0, 1)


class GraphReplayError(RuntimeError):
    """A replay would have launched something other than what was captured (emulation mode)."""


def default_mode() -> str:
    return "cuda" if triton_mode() == "native" and torch.cuda.is_available() else "emulate"


@dataclass(frozen=True)
class GraphDispatch:
    """What upstream's capture path decided: the builder's capture flag, the layer's adaptive splits and the trust
    gate it hands the decode."""

    for_cudagraph_capture: bool
    adaptive_splits: bool
    trust_extra_nan_free: bool


@dataclass(frozen=True)
class PoolArg:
    """A tensor the wrapper allocated during the launch sequence: a graph keeps it in its private pool, so a replay
    must give the ``index``-th allocation the same layout."""

    index: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str


# --- upstream's capture-time decisions ----------------------------------------------------------------------------

def capture_flag(ctx) -> bool:
    """``for_cudagraph_capture`` as upstream's ``build_for_cudagraph_capture`` sets it."""
    rocm = ctx["rocm"]
    builder_cls = rocm.DeepseekV4ROCMAiterMLASparseMetadataBuilder
    parent = builder_cls.__mro__[1]
    built = types.SimpleNamespace(for_cudagraph_capture=None)

    def run():
        builder = object.__new__(builder_cls)
        with mock.patch.object(parent, "build_for_cudagraph_capture", lambda self, cm: built, create=True):
            md = builder_cls.build_for_cudagraph_capture(builder, types.SimpleNamespace())
        return md.for_cudagraph_capture

    flag = ctx.call(run)
    if not isinstance(flag, bool):
        raise RuntimeError(f"upstream's build_for_cudagraph_capture left for_cudagraph_capture = {flag!r}")
    return flag


def layer_adaptive_splits(ctx, compress_ratio: int, batch: int, heads: int, for_capture: bool) -> bool:
    """The ``adaptive_splits`` upstream's ``forward_mqa`` hands ``_forward_decode`` for a decode-only batch."""
    rocm = ctx["rocm"]
    seen: dict = {}

    def forward_decode(**kw):
        seen.update(kw)
        return 0

    layer = types.SimpleNamespace(
        prefix="attn", swa_cache_layer=types.SimpleNamespace(prefix="swa", kv_cache=None),
        compress_ratio=compress_ratio, kv_cache=None,
        # a non-None fp8 wo_a keeps the inverse RoPE out of this call (it is not part of the decode step)
        _wo_a_fp8_weight=object(), _forward_decode=forward_decode,
        **aiter_flags_off(rocm.DeepseekV4ROCMAiterMLAAttention))
    metadata = types.SimpleNamespace(for_cudagraph_capture=for_capture)
    swa = types.SimpleNamespace(num_decodes=batch, num_prefills=0, num_decode_tokens=batch)
    forward_context = types.SimpleNamespace(attn_metadata={"attn": metadata, "swa": swa})
    q = torch.empty(batch, heads, HEAD_WIDTH, dtype=torch.bfloat16, device="meta")

    def run():
        with mock.patch.object(rocm, "get_forward_context", lambda: forward_context):
            rocm.DeepseekV4ROCMAiterMLAAttention.forward_mqa(layer, q, None, torch.empty(batch, device="meta"),
                                                             torch.empty_like(q))

    ctx.call(run)
    if "adaptive_splits" not in seen:
        raise RuntimeError("upstream's forward_mqa did not reach _forward_decode for a decode-only batch")
    return bool(seen["adaptive_splits"])


# --- launch observers ---------------------------------------------------------------------------------------------

class _Normalizer:
    """Turns one launch sequence's arguments into comparable values (see the module docstring)."""

    def __init__(self, persistent):
        self.persistent = {int(t.untyped_storage().data_ptr()) for t in persistent if t is not None}
        self.pool: dict[int, int] = {}

    def __call__(self, value):
        if not isinstance(value, torch.Tensor):
            return value
        layout = (tuple(int(x) for x in value.shape), tuple(int(x) for x in value.stride()), dtype_name(value.dtype))
        base = int(value.untyped_storage().data_ptr())
        if base in self.persistent:
            return TensorArg(int(value.data_ptr()), *layout)
        index = self.pool.setdefault(base, len(self.pool))
        return PoolArg(index, int(value.data_ptr()) - base, *layout)


def _record(normalize: _Normalizer, arg_names: dict, name: str, grid, args, kwargs) -> LaunchRecord:
    names = arg_names.get(name) or []
    labels = [names[i] if i < len(names) else f"arg{i}" for i in range(len(args))]
    return LaunchRecord(name, tuple(int(g) for g in grid), tuple((n, normalize(a)) for n, a in zip(labels, args)),
                        tuple(sorted((k, normalize(v)) for k, v in kwargs.items())))


class _Observer:
    """``edit`` hook of the launch proxies: records each launch (``expected`` None) or checks it against the
    captured sequence before it runs."""

    def __init__(self, normalize: _Normalizer, arg_names: dict, expected=None):
        self.normalize, self.arg_names, self.expected = normalize, arg_names, expected
        self.records: list[LaunchRecord] = []

    def __call__(self, name, grid, args, kwargs):
        rec = _record(self.normalize, self.arg_names, name, grid, args, kwargs)
        if self.expected is not None:
            i = len(self.records)
            if i >= len(self.expected):
                raise GraphReplayError(f"replay issued launch {i} ({name}), but capture recorded only "
                                       f"{len(self.expected)} launches")
            if rec != self.expected[i]:
                raise GraphReplayError(describe_launch_diff(i, self.expected[i], rec))
        self.records.append(rec)
        return args, kwargs

    def finish(self) -> None:
        if self.expected is not None and len(self.records) != len(self.expected):
            raise GraphReplayError(f"replay issued {len(self.records)} launches, capture recorded "
                                   f"{len(self.expected)}")


# --- the graph ----------------------------------------------------------------------------------------------------

#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "rocm": [
        "DeepseekV4ROCMAiterMLAAttention", "DeepseekV4ROCMAiterMLASparseMetadataBuilder",
        "_copy_ragged_to_graph_buffers", "_trust_dsv4_extra_cache_nan_free",
    ],
}, since={"rocm.DeepseekV4ROCMAiterMLAAttention": "0.23.0", "rocm._trust_dsv4_extra_cache_nan_free": "0.28.0"})


def build(ctx) -> Family:
    ops, rocm = ctx["ops"], ctx["rocm"]

    class DecodeGraph:
        """Upstream's decode step captured on this subject's target (see the module docstring). Attributes as
        ours: ``target``, ``dispatch``, ``plan`` (read off the captured launches), ``mode``, ``batch``,
        ``num_heads``, ``launches``, ``out``, ``workspace`` (None: upstream allocates its partials inside the
        captured region), the persistent buffers and ``last_views``."""

        def __init__(self):
            raise TypeError("DecodeGraph: use DecodeGraph.capture(...)")

        @classmethod
        def capture(cls, q, main_cache, main_indices, main_indptr, extra_cache=None, extra_indices=None,
                    extra_indptr=None, *, max_per_row_main, max_per_row_extra=None, compress_ratio,
                    attn_sink=None, softmax_scale=None, target=None, cu_count=None, kv_cache_dtype="fp8_ds_mla",
                    has_kv_transfer=False, mode=None, for_cudagraph_capture=None):
            same_target(ctx, target)
            mode = default_mode() if mode is None else mode
            if mode not in MODES:
                raise ValueError(f"mode: expected one of {', '.join(MODES)} or None, got {mode!r}")
            if mode == "cuda" and default_mode() != "cuda":
                raise ValueError("mode: 'cuda' needs native Triton and a GPU torch can capture on")
            if mode == "cuda":
                _native_fnuz_unavailable(ctx.target)
            given = [x is not None for x in (extra_cache, extra_indices, extra_indptr)]
            if any(given) and not all(given):
                raise ValueError("extra_cache, extra_indices, extra_indptr: give all three or none")
            has_extra = all(given)
            swa_only = compress_ratio in SWA_ONLY_RATIOS
            if has_extra == swa_only:
                raise ValueError(f"extra_cache: compress_ratio {compress_ratio} "
                                 f"{'reads no' if swa_only else 'needs a'} compressed (extra) cache")
            g = object.__new__(cls)
            rows, heads = int(q.shape[0]), int(q.shape[1])
            device = q.device
            # the flag of the metadata the step was built with, else the one upstream's builder sets
            flag = capture_flag(ctx) if for_cudagraph_capture is None else bool(for_cudagraph_capture)
            trust = bool(ctx.call(rocm._trust_dsv4_extra_cache_nan_free, kv_cache_dtype, has_kv_transfer,
                                  not swa_only and has_extra))
            g.dispatch = GraphDispatch(flag, layer_adaptive_splits(ctx, compress_ratio, rows, heads, flag), trust)
            g.target, g.mode, g.batch, g.num_heads, g.has_extra = ctx.target, mode, rows, heads, has_extra
            g.max_per_row_main = int(max_per_row_main)
            g.max_per_row_extra = int(max_per_row_extra) if has_extra else None
            g.main_cache, g.extra_cache, g.attn_sink = main_cache, extra_cache, attn_sink
            g.softmax_scale = DEFAULT_SCALE if softmax_scale is None else float(softmax_scale)
            g.cu_count = effective_cu_count(ctx.target) if cu_count is None else int(cu_count)
            # the builders allocate these with torch.empty; zero here so that a run is reproducible
            g.q_buffer = torch.zeros(rows, heads, HEAD_WIDTH, dtype=torch.bfloat16, device=device)
            g.out = torch.zeros(rows, heads, HEAD_WIDTH, dtype=torch.bfloat16, device=device)
            g.main_indices_buffer = torch.zeros(max(rows * g.max_per_row_main, 1), dtype=torch.int32, device=device)
            g.main_indptr_buffer = torch.zeros(rows + 1, dtype=torch.int32, device=device)
            g.extra_indices_buffer = g.extra_indptr_buffer = None
            if has_extra:
                g.extra_indices_buffer = torch.zeros(max(rows * g.max_per_row_extra, 1), dtype=torch.int32,
                                                     device=device)
                g.extra_indptr_buffer = torch.zeros(rows + 1, dtype=torch.int32, device=device)
            g.workspace = None
            g.q_buffer.copy_(q)
            g._copy_ragged(main_indices, main_indptr, extra_indices, extra_indptr)
            g._views = dict(g.last_views)
            g._graph = None
            if mode == "emulate":
                obs = g._observer()
                g._launch(obs)
                g.launches = tuple(obs.records)
            else:
                g._capture_cuda()
            g.plan = plan_from_launches(types.SimpleNamespace(records=g._raw))
            g.replays = 0
            return g

        # --- launches ---------------------------------------------------------------------------------------

        def _persistent(self):
            return (self.q_buffer, self.out, self.main_indices_buffer, self.main_indptr_buffer,
                    self.extra_indices_buffer, self.extra_indptr_buffer, self.main_cache, self.extra_cache,
                    self.attn_sink)

        def _observer(self, expected=None) -> _Observer:
            return _Observer(_Normalizer(self._persistent()), {}, expected)

        def _launch(self, observer: _Observer) -> None:
            """Upstream's decode wrapper on the persistent buffers and the captured views, every launch seen by
            ``observer`` before it runs."""
            v = self._views

            def run():
                observer.arg_names = {n: list(getattr(getattr(ops, n), "arg_names", None) or [])
                                      for n in ("_sparse_attn_decode_ragged_kernel",
                                                "_sparse_attn_decode_partial_kernel",
                                                "_sparse_attn_decode_gfx950_partial_kernel",
                                                "_sparse_attn_decode_reduce_kernel")}
                rec = _Launches(ops, run=True, edit=observer)
                with pinned_cu(ops, self.cu_count), rec.installed():
                    _call_public(ops, self.q_buffer, self.main_cache, v["main_indices"], v["main_indptr"],
                                 self.extra_cache, v.get("extra_indices"), v.get("extra_indptr"), self.attn_sink,
                                 self.softmax_scale, self.out, self.dispatch.trust_extra_nan_free,
                                 self.dispatch.adaptive_splits)
                return rec.records

            self._raw = ctx.call(run)

        def _capture_cuda(self) -> None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                obs = self._observer()
                self._launch(obs)  # warm-up: Triton compiles here, never inside the capture
            torch.cuda.current_stream().wait_stream(side)
            self.launches = tuple(obs.records)
            graph = torch.cuda.CUDAGraph()
            check = self._observer(self.launches)
            with torch.cuda.graph(graph):
                self._launch(check)
            check.finish()
            self._graph = graph
            graph.replay()

        # --- copies -----------------------------------------------------------------------------------------

        def _pad_indptr(self, indptr, rows):
            if rows == self.batch:
                return indptr
            return torch.cat([indptr, indptr[-1:].expand(self.batch - rows)])

        def _copy_ragged(self, main_indices, main_indptr, extra_indices, extra_indptr) -> None:
            segments = [("main", main_indices, main_indptr, self.main_indices_buffer, self.main_indptr_buffer,
                         self.max_per_row_main)]
            if self.has_extra:
                segments.append(("extra", extra_indices, extra_indptr, self.extra_indices_buffer,
                                 self.extra_indptr_buffer, self.max_per_row_extra))
            views = {}
            for prefix, idx, ptr, ibuf, pbuf, mpr in segments:
                iview, pview = ctx.call(rocm._copy_ragged_to_graph_buffers, idx, ptr, ibuf, pbuf, self.batch, mpr)
                views[f"{prefix}_indices"], views[f"{prefix}_indptr"] = iview, pview
            self.last_views = views

        # --- replay -----------------------------------------------------------------------------------------

        def replay(self, q, main_indices, main_indptr, extra_indices=None, extra_indptr=None, *,
                   check_indptr=True):
            """Copy one step (``rows <= batch``; the rest run as empty rows) into the persistent buffers and
            replay the captured launches; returns ``out[:rows]``."""
            rows = int(q.shape[0])
            if rows < 1 or rows > self.batch or tuple(q.shape[1:]) != (self.num_heads, HEAD_WIDTH):
                raise ValueError(f"q: expected [1..{self.batch}, {self.num_heads}, {HEAD_WIDTH}], got "
                                 f"{list(q.shape)}")
            if self.has_extra != (extra_indices is not None) or self.has_extra != (extra_indptr is not None):
                raise ValueError("extra_indices, extra_indptr: expected both exactly when the graph was captured "
                                 "with an extra cache")
            self.q_buffer[:rows].copy_(q)
            if rows < self.batch:
                self.q_buffer[rows:].zero_()
            self._copy_ragged(main_indices, self._pad_indptr(main_indptr, rows), extra_indices,
                              self._pad_indptr(extra_indptr, rows) if self.has_extra else None)
            if self.mode == "cuda":
                self._graph.replay()
            else:
                check = self._observer(self.launches)
                self._launch(check)
                check.finish()
            self.replays += 1
            return self.out[:rows]

        def buffer_pointers(self) -> dict:
            bufs = {"q": self.q_buffer, "out": self.out, "main_indices": self.main_indices_buffer,
                    "main_indptr": self.main_indptr_buffer}
            if self.has_extra:
                bufs.update(extra_indices=self.extra_indices_buffer, extra_indptr=self.extra_indptr_buffer)
            return {k: int(v.data_ptr()) for k, v in bufs.items()}

        def __repr__(self):
            return (f"DecodeGraph(vllm, target={self.target.name}, mode={self.mode}, batch={self.batch}, "
                    f"heads={self.num_heads}, plan={self.plan}, launches={len(self.launches)})")

    return Family("graph_capture", DecodeGraph=DecodeGraph, GraphReplayError=GraphReplayError, MODES=MODES,
                  default_mode=default_mode)
