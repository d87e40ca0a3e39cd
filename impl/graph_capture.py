"""Graph capture and replay of the DSv4 sparse decode (SPEC 2: adaptive splits, ``_copy_ragged_to_graph_buffers``).

A captured graph replays a fixed sequence of kernel launches: the same kernels, grids, pointers and host-side
scalars every time. ``DecodeGraph`` is the decode's capture mode:

- **Capture** (``DecodeGraph.capture``) takes one decode step's inputs and the layer's flags. It allocates the
  persistent buffers (q, the main/extra index buffers of ``num_rows * max_per_row`` entries, the indptr buffers of
  ``num_rows + 1``, the split-K workspace and the output), copies the step's data into them with
  ``copy_ragged_to_graph_buffers`` (the target's view rule), and freezes the launch: the dispatch comes from
  ``decode_dispatch(..., for_cudagraph_capture=True)`` and the plan from ``plan_decode`` on the views' sizes, so
  adaptive splits are on exactly where the dispatch allows them (gfx950, compress ratio 128, not SWA-only) and the
  host rule agrees (base >= 16, S > 4). Batch, split count, head blocks, ONE_WAVE, scale, trust gate and every
  stride are fixed from then on.
- **Replay** (``DecodeGraph.replay``) copies a new step's q, indices and indptr into the same buffers (fewer rows
  than captured are padded with empty rows) and re-issues the frozen launches. Only device data changes.

Two modes, chosen by ``mode`` (default: ``"cuda"`` when Triton compiles natively and torch sees a GPU, else
``"emulate"``):

- ``"cuda"``: a real ``torch.cuda.CUDAGraph`` (warm-up on a side stream, capture, ``replay()``).
- ``"emulate"`` (the Triton interpreter, or on request): the capture run records every launch through the decode's
  launch observer (``impl.decode.launch_observer``); each replay runs the decode's host path with the frozen plan
  on the persistent buffers under an observer that compares every launch with the captured one *before* it runs:
  kernel, grid, every pointer, shape, stride, scalar and meta-parameter must be equal, and the number of launches
  too. Any difference raises ``GraphReplayError`` (a real graph would silently keep the captured values). The
  replay hands the decode the *captured* views (a graph reads the base pointer; the view's length only mattered to
  the plan) and does not read indptr on the host inside the launch sequence.

Source: vllm-project/vllm ``vllm/models/deepseek_v4/amd/rocm.py`` (``_copy_ragged_to_graph_buffers``, the adaptive
splits flag under ``for_cudagraph_capture``) and ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` as SPEC section
2 restates them; the persistent-buffer pattern is the one ``torch.cuda.graphs`` documents.
"""
from __future__ import annotations

import math

import torch

from impl import formats
from impl.decode import (DecodePlan, DecodeWorkspace, LaunchRecord, launch_observer, plan_decode,
                         sparse_attn_decode)
from impl.dispatch import SWA_ONLY_RATIOS, decode_dispatch
from impl.graph_buffers import copy_ragged_to_graph_buffers
from impl.runtime import kernel_device, native_without_gpu_hint, triton_mode
from impl.targets import Target, get_target
from impl.validation import dtype_name as _name_dtype, require_tensor, require_valid_indptr

MODES = ("cuda", "emulate")
HEAD_WIDTH = formats.DSV4_NOPE_DIM + formats.DSV4_ROPE_DIM


class GraphReplayError(RuntimeError):
    """A replay would have launched something other than what was captured (emulation mode)."""


def default_mode() -> str:
    """``"cuda"`` when kernels compile natively on a GPU torch can capture, else ``"emulate"``."""
    return "cuda" if triton_mode() == "native" and torch.cuda.is_available() else "emulate"




def describe_launch_diff(i: int, want: LaunchRecord, got: LaunchRecord, limit: int = 4) -> str:
    """One line saying how replayed launch ``i`` differs from the captured one (at most ``limit`` differences)."""
    diffs = []
    if want.kernel != got.kernel:
        diffs.append(f"kernel {want.kernel} at capture, {got.kernel} at replay")
    if want.grid != got.grid:
        diffs.append(f"grid {want.grid} at capture, {got.grid} at replay")
    for label, a, b in (("argument", want.args, got.args), ("meta-parameter", want.meta, got.meta)):
        da, db = dict(a), dict(b)
        for name in list(da) + [n for n in db if n not in da]:
            if da.get(name, "<absent>") != db.get(name, "<absent>"):
                diffs.append(f"{label} {name}: {da.get(name, '<absent>')} at capture, "
                             f"{db.get(name, '<absent>')} at replay")
    more = f" (and {len(diffs) - limit} more)" if len(diffs) > limit else ""
    return f"launch {i} ({want.kernel}) differs from the captured one: " + "; ".join(diffs[:limit]) + more


class _LaunchRecorder:
    def __init__(self):
        self.records: list[LaunchRecord] = []

    def __call__(self, record: LaunchRecord) -> None:
        self.records.append(record)


class _LaunchVerifier:
    """Compares each launch with the captured sequence before it runs; ``finish`` checks nothing was left out."""

    def __init__(self, expected: tuple[LaunchRecord, ...]):
        self.expected = expected
        self.count = 0

    def __call__(self, record: LaunchRecord) -> None:
        i = self.count
        if i >= len(self.expected):
            raise GraphReplayError(f"replay issued launch {i} ({record.kernel}), but capture recorded only "
                                   f"{len(self.expected)} launches")
        if record != self.expected[i]:
            raise GraphReplayError(describe_launch_diff(i, self.expected[i], record))
        self.count += 1

    def finish(self) -> None:
        if self.count != len(self.expected):
            raise GraphReplayError(f"replay issued {self.count} launches, capture recorded {len(self.expected)}")


def _require_count(name: str, v, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {v}")
    return v


def _check_q(q, num_heads: int | None, max_rows: int | None, device) -> int:
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    if q.dtype != torch.bfloat16:
        raise TypeError(f"q: expected dtype bfloat16, got {_name_dtype(q.dtype)}")
    if q.dim() != 3 or q.shape[2] != HEAD_WIDTH or (num_heads is not None and q.shape[1] != num_heads):
        heads = "heads" if num_heads is None else str(num_heads)
        raise ValueError(f"q: expected shape [rows, {heads}, {HEAD_WIDTH}], got {list(q.shape)}")
    rows = int(q.shape[0])
    if rows < 1 or q.shape[1] < 1:
        raise ValueError(f"q: expected at least one row and one head, got shape {list(q.shape)}")
    if max_rows is not None and rows > max_rows:
        raise ValueError(f"q: {rows} rows, more than the {max_rows} rows the graph was captured with")
    if device is None:
        if q.device.type != kernel_device():
            raise ValueError(f"q: kernels run on '{kernel_device()}' here, got a tensor on {q.device}"
                             f"{native_without_gpu_hint()}")
    elif q.device != device:
        raise ValueError(f"q: expected device {device}, got {q.device}")
    return rows


def _check_ragged(prefix: str, indices, indptr, rows: int, max_per_row: int, capacity: int, device,
                  check_indptr: bool) -> None:
    """Everything ``copy_ragged_to_graph_buffers`` would reject, checked before any buffer is written (so that a
    bad extra segment cannot leave the main segment already overwritten)."""
    for name, t in ((f"{prefix}_indices", indices), (f"{prefix}_indptr", indptr)):
        require_tensor(name, t, torch.int32, dim=1, device=device)
    if indptr.numel() != rows + 1:
        raise ValueError(f"{prefix}_indptr: expected rows + 1 = {rows + 1} entries, got {indptr.numel()}")
    if indices.numel() > capacity:
        raise ValueError(f"{prefix}_indices: {indices.numel()} entries do not fit the graph capacity "
                         f"max(num_rows * max_per_row, 1) = {capacity}")
    if not check_indptr:
        return
    require_valid_indptr(f"{prefix}_indptr", indptr, f"{prefix}_indices", indices.numel(), starts_at_zero=True,
                         max_row=max_per_row, max_row_name=f"the captured max_per_row_{prefix}")


class DecodeGraph:
    """A captured sparse decode: persistent buffers, a frozen dispatch and plan, and the captured launches.

    Build with ``DecodeGraph.capture``; run with ``replay``. Attributes: ``target``, ``dispatch``
    (``DecodeDispatch``), ``plan`` (``DecodePlan``), ``mode``, ``batch``, ``num_heads``, ``launches`` (the captured
    ``LaunchRecord`` sequence), ``out`` (the persistent output ``[batch, heads, 512]``), ``workspace``, and the
    persistent buffers ``q_buffer``, ``main_indices_buffer``, ``main_indptr_buffer`` and, with an extra cache,
    ``extra_indices_buffer``, ``extra_indptr_buffer``. ``last_views`` holds the views the latest copy returned."""

    def __init__(self):
        raise TypeError("DecodeGraph: use DecodeGraph.capture(...)")

    # --- capture ------------------------------------------------------------------------------------------------

    @classmethod
    def capture(cls, q: torch.Tensor, main_cache: torch.Tensor, main_indices: torch.Tensor,
                main_indptr: torch.Tensor, extra_cache: torch.Tensor | None = None,
                extra_indices: torch.Tensor | None = None, extra_indptr: torch.Tensor | None = None, *,
                max_per_row_main: int, max_per_row_extra: int | None = None, compress_ratio: int,
                attn_sink: torch.Tensor | None = None, softmax_scale: float | None = None,
                target: "Target | str | None" = None, cu_count: int | None = None,
                kv_cache_dtype: str = "fp8_ds_mla", has_kv_transfer: bool = False,
                mode: str | None = None, for_cudagraph_capture: bool = True) -> "DecodeGraph":
        """Capture one decode step of ``q [num_rows, heads, 512]`` (bf16) over the caches (kept by reference: the
        graph reads them at their captured addresses, their contents may change between replays).

        ``max_per_row_main``/``max_per_row_extra``: the most entries a row may hold in any replay (the index
        buffers hold ``num_rows * max_per_row``). ``compress_ratio`` (0/1 SWA-only, 4, 128) and ``kv_cache_dtype``/
        ``has_kv_transfer`` go to ``decode_dispatch``, which decides adaptive splits and the trust gate.
        ``cu_count`` overrides the target's CU count for the split selector. ``for_cudagraph_capture`` is the flag
        of the metadata the capture step was built with (a metadata builder's ``build_for_cudagraph_capture`` sets
        it where the target takes the adaptive path): the dispatch decides adaptive splits from it. Every argument
        is validated before anything is allocated or launched."""
        t = get_target(target)
        if mode is None:
            mode = default_mode()
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)} or None, got {mode!r}")
        if mode == "cuda" and default_mode() != "cuda":
            raise ValueError(f"mode: 'cuda' needs native Triton and a GPU torch can capture on; here Triton runs as "
                             f"{triton_mode()} and torch.cuda.is_available() is {torch.cuda.is_available()}")
        num_rows = _check_q(q, None, None, None)
        device = q.device
        num_heads = int(q.shape[1])
        extra_given = [x is not None for x in (extra_cache, extra_indices, extra_indptr)]
        if any(extra_given) and not all(extra_given):
            raise ValueError("extra_cache, extra_indices, extra_indptr: give all three or none")
        has_extra = all(extra_given)
        if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int):
            raise TypeError(f"compress_ratio: expected an int, got {type(compress_ratio).__name__}")
        dispatch = decode_dispatch(t, compress_ratio=compress_ratio, swa_only=compress_ratio in SWA_ONLY_RATIOS,
                                   for_cudagraph_capture=for_cudagraph_capture, has_extra_cache=has_extra,
                                   kv_cache_dtype=kv_cache_dtype, has_kv_transfer=has_kv_transfer)
        if not has_extra and compress_ratio not in SWA_ONLY_RATIOS:
            raise ValueError(f"extra_cache: a layer with compress_ratio {compress_ratio} reads a compressed (extra) "
                             f"cache; none was given")
        max_main = _require_count("max_per_row_main", max_per_row_main)
        if cu_count is not None:
            _require_count("cu_count", cu_count, 1)
        if has_extra:
            if max_per_row_extra is None:
                raise ValueError("max_per_row_extra: required with an extra cache")
            max_extra = _require_count("max_per_row_extra", max_per_row_extra)
        elif max_per_row_extra is not None:
            raise ValueError("max_per_row_extra: given without an extra cache")
        else:
            max_extra = 0
        formats.check_fp8_ds_mla_cache(main_cache, "main_cache")
        if main_cache.device != device:
            raise ValueError(f"main_cache: expected device {device}, got {main_cache.device}")
        if has_extra:
            formats.check_fp8_ds_mla_cache(extra_cache, "extra_cache")
            if extra_cache.device != device:
                raise ValueError(f"extra_cache: expected device {device}, got {extra_cache.device}")
        if attn_sink is not None:
            if not isinstance(attn_sink, torch.Tensor) or attn_sink.dtype != torch.float32 or attn_sink.dim() != 1:
                raise TypeError("attn_sink: expected a 1-D float32 tensor")
            if attn_sink.numel() < num_heads or not attn_sink.is_contiguous() or attn_sink.device != device:
                raise ValueError(f"attn_sink: expected a contiguous tensor of at least {num_heads} entries on "
                                 f"{device}")
        scale = formats.DSV4_HEAD_DIM ** -0.5 if softmax_scale is None else softmax_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ValueError(f"softmax_scale: expected a finite float, got {softmax_scale!r}")
        main_cap = max(num_rows * max_main, 1)
        extra_cap = max(num_rows * max_extra, 1)
        _check_ragged("main", main_indices, main_indptr, num_rows, max_main, main_cap, device, True)
        if has_extra:
            _check_ragged("extra", extra_indices, extra_indptr, num_rows, max_extra, extra_cap, device, True)

        g = object.__new__(cls)
        g.target, g.dispatch, g.mode = t, dispatch, mode
        g.batch, g.num_heads = num_rows, num_heads
        g.max_per_row_main, g.max_per_row_extra = max_main, (max_extra if has_extra else None)
        g.has_extra = has_extra
        g.main_cache, g.extra_cache, g.attn_sink = main_cache, extra_cache, attn_sink
        g.softmax_scale = float(scale)
        g.cu_count = cu_count
        # persistent buffers, zero-initialised: capacity never read is still defined
        g.q_buffer = torch.zeros(num_rows, num_heads, HEAD_WIDTH, dtype=torch.bfloat16, device=device)
        g.main_indices_buffer = torch.zeros(main_cap, dtype=torch.int32, device=device)
        g.main_indptr_buffer = torch.zeros(num_rows + 1, dtype=torch.int32, device=device)
        g.extra_indices_buffer = torch.zeros(extra_cap, dtype=torch.int32, device=device) if has_extra else None
        g.extra_indptr_buffer = torch.zeros(num_rows + 1, dtype=torch.int32, device=device) if has_extra else None
        g.q_buffer.copy_(q)
        g._copy_ragged(main_indices, main_indptr, extra_indices, extra_indptr)
        g._main_view, g._main_indptr_view = g.last_views["main_indices"], g.last_views["main_indptr"]
        g._extra_view = g.last_views.get("extra_indices")
        g._extra_indptr_view = g.last_views.get("extra_indptr")
        # the split selector sees the views' sizes: the target's view rule decides what the frozen grid covers
        g.plan = plan_decode(t, num_rows, num_heads, g._main_view.numel(),
                             g._extra_view.numel() if has_extra else 0,
                             adaptive_splits=dispatch.adaptive_splits, cu_count=cu_count)
        g.workspace = (DecodeWorkspace.allocate(num_rows, g.plan.num_splits, num_heads, device)
                       if g.plan.family != "generic" else None)
        g.out = torch.zeros(num_rows, num_heads, HEAD_WIDTH, dtype=torch.bfloat16, device=device)
        g._graph = None
        recorder = _LaunchRecorder()
        if mode == "emulate":
            with launch_observer(recorder):
                g._launch(g.plan)
            g.launches = tuple(recorder.records)
        else:
            g._capture_cuda(recorder)
        g.replays = 0
        return g

    def _capture_cuda(self, recorder: _LaunchRecorder) -> None:
        # warm-up on a side stream (Triton compiles here, never inside the capture), as torch.cuda.graphs asks
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with launch_observer(recorder):
                self._launch(self.plan)
        torch.cuda.current_stream().wait_stream(side)
        self.launches = tuple(recorder.records)
        graph = torch.cuda.CUDAGraph()
        verifier = _LaunchVerifier(self.launches)
        with torch.cuda.graph(graph):
            with launch_observer(verifier):
                self._launch(self.plan)
        verifier.finish()
        self._graph = graph
        graph.replay()

    # --- the launch sequence ------------------------------------------------------------------------------------

    def _launch(self, plan: DecodePlan) -> None:
        """The decode's launches on the persistent buffers and the captured views (no host read of indptr)."""
        sparse_attn_decode(self.q_buffer, self.main_cache, self._main_view, self._main_indptr_view,
                           self.extra_cache, self._extra_view, self._extra_indptr_view, attn_sink=self.attn_sink,
                           softmax_scale=self.softmax_scale, target=self.target,
                           trust_extra_nan_free=self.dispatch.trust_extra_nan_free,
                           cu_count=getattr(self, "cu_count", None), plan=plan, workspace=self.workspace, out=self.out,
                           check_indptr=False)

    def _pad_indptr(self, indptr: torch.Tensor, rows: int) -> torch.Tensor:
        """A replay with fewer rows than captured: the missing rows are empty (indptr repeats its last entry)."""
        if rows == self.batch:
            return indptr
        return torch.cat([indptr, indptr[-1:].expand(self.batch - rows)])

    def _copy_ragged(self, main_indices, main_indptr, extra_indices, extra_indptr) -> None:
        views = {}
        segments = [("main", main_indices, main_indptr, self.main_indices_buffer, self.main_indptr_buffer,
                     self.max_per_row_main)]
        if self.has_extra:
            segments.append(("extra", extra_indices, extra_indptr, self.extra_indices_buffer,
                             self.extra_indptr_buffer, self.max_per_row_extra))
        for prefix, idx, ptr, ibuf, pbuf, mpr in segments:
            iview, pview = copy_ragged_to_graph_buffers(idx, ptr, ibuf, pbuf, self.batch, mpr, target=self.target,
                                                        check_indptr=False)
            for name, view, buf in ((f"{prefix}_indices", iview, ibuf), (f"{prefix}_indptr", pview, pbuf)):
                if view.data_ptr() != buf.data_ptr():
                    raise GraphReplayError(f"{name}: the copied view starts at {hex(view.data_ptr())}, not at the "
                                           f"persistent buffer's base {hex(buf.data_ptr())}")
                views[name] = view
        self.last_views = views

    # --- replay -------------------------------------------------------------------------------------------------

    def replay(self, q: torch.Tensor, main_indices: torch.Tensor, main_indptr: torch.Tensor,
               extra_indices: torch.Tensor | None = None, extra_indptr: torch.Tensor | None = None, *,
               check_indptr: bool = True) -> torch.Tensor:
        """Copy one step's ``q [rows, heads, 512]`` (rows <= the captured rows; the rest run as empty rows) and
        ragged indices/indptr into the persistent buffers and replay the frozen launches. Returns ``out[:rows]``,
        a view of the persistent output (the next replay overwrites it). Bad input (more rows than captured, a
        row wider than its ``max_per_row``, a wrong dtype/shape/device, a missing or unexpected extra segment)
        raises ValueError/TypeError naming the argument before anything is written; ``check_indptr`` reads the
        indptrs on the host for that (outside the launch sequence). With ``check_indptr=False`` (what a caller that
        must not sync does) rows wider than ``max_per_row`` or an ``indptr[-1]`` past the buffer are NOT caught:
        the kernels would read past the persistent index buffer; the caller owns those bounds."""
        if not isinstance(check_indptr, bool):
            raise TypeError(f"check_indptr: expected a bool, got {type(check_indptr).__name__}")
        device = self.q_buffer.device
        rows = _check_q(q, self.num_heads, self.batch, device)
        if self.has_extra != (extra_indices is not None) or self.has_extra != (extra_indptr is not None):
            want = "given" if self.has_extra else "None"
            raise ValueError(f"extra_indices, extra_indptr: the graph was captured "
                             f"{'with' if self.has_extra else 'without'} an extra cache; expected both {want}")
        _check_ragged("main", main_indices, main_indptr, rows, self.max_per_row_main,
                      self.main_indices_buffer.numel(), device, check_indptr)
        if self.has_extra:
            _check_ragged("extra", extra_indices, extra_indptr, rows, self.max_per_row_extra,
                          self.extra_indices_buffer.numel(), device, check_indptr)

        # --- writes (nothing above wrote anything) ---
        self.q_buffer[:rows].copy_(q)
        if rows < self.batch:
            self.q_buffer[rows:].zero_()
        self._copy_ragged(main_indices, self._pad_indptr(main_indptr, rows),
                          extra_indices, self._pad_indptr(extra_indptr, rows) if self.has_extra else None)
        if self.mode == "cuda":
            self._graph.replay()
        else:
            verifier = _LaunchVerifier(self.launches)
            with launch_observer(verifier):
                self._launch(self.plan)
            verifier.finish()
        self.replays += 1
        return self.out[:rows]

    # --- introspection ------------------------------------------------------------------------------------------

    def buffer_pointers(self) -> dict[str, int]:
        """Data pointers of every persistent buffer (equal before and after any replay)."""
        bufs = {"q": self.q_buffer, "out": self.out, "main_indices": self.main_indices_buffer,
                "main_indptr": self.main_indptr_buffer}
        if self.has_extra:
            bufs.update(extra_indices=self.extra_indices_buffer, extra_indptr=self.extra_indptr_buffer)
        if self.workspace is not None:
            bufs.update(part_m=self.workspace.part_m, part_l=self.workspace.part_l,
                        part_acc=self.workspace.part_acc)
        return {k: int(v.data_ptr()) for k, v in bufs.items()}

    def __repr__(self) -> str:
        return (f"DecodeGraph(target={self.target.name}, mode={self.mode}, batch={self.batch}, "
                f"heads={self.num_heads}, plan={self.plan}, launches={len(self.launches)})")


__all__ = ["DecodeGraph", "GraphReplayError", "MODES", "default_mode"]
