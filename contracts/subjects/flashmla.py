"""The ``flashmla`` subject: FlashMLA's SM90/SM100 sparse decode (the ``sgl-flash-mla`` wheel, its legacy extension,
``flash_mla_with_kvcache(..., use_legacy=True, kv_format="V4")``) behind our decode API, so the decode contracts judge
a production CUDA kernel natively on an NVIDIA GPU.

What FlashMLA takes, from its Python wrapper (``flash_mla/flash_mla_interface.py``) and its extension's checks:

- ``q`` [b, s_q, h_q, 512] bf16 with h_q 64 or 128;
- ``k_cache`` [num_blocks, page_block_size, 1, bytes_per_token] uint8, the format read off bytes_per_token (584: V4),
  each page block contiguous, ``stride(0)`` a multiple of 576 (its padding), the base 16 B aligned;
- ``indices`` [b, s_q, topk] int32, index = block * page_block_size + offset, only exactly -1 invalid (no upper
  bound check), topk a multiple of its tile (64); ``topk_length`` [b] int32: only the leftmost entries are read;
- the same for ``extra_k_cache`` / ``extra_indices_in_kvcache`` / ``extra_topk_length``;
- ``attn_sink`` [h_q] fp32 (-inf: no sink); ``softmax_scale``.

Our DSv4 cache (SPEC 1.2, :class:`impl.formats.Fp8DsMlaLayout`) is FlashMLA's V4 block byte for byte (data region
of 576 B per token, then 8 B of scale codes per token, blocks padded to 576 B), and our slot ids are its indices, so
the conversion (:func:`flashmla_cache`, :func:`flashmla_indices`, :func:`flashmla_sink`) is a view where it can be:

- the cache is passed as a ``[nb, bs, 1, 584]`` view of the same bytes; it is copied (same block size, padded
  stride) only when its stride or base address breaks FlashMLA's alignment rules, and regrouped into 64-token
  blocks (slot ids unchanged) only if FlashMLA refuses the block size;
- a ragged index list (indices, indptr) becomes a -1-padded dense [b, 1, W] list with ``topk_length``; entries our
  API defines as invalid (outside [0, nb * bs)) become -1, which FlashMLA's documented caller contract requires;
- q and the sink are padded with zero / -inf heads up to 64 (or split in groups of 64), as vLLM pads heads for it.

Every conversion applied is listed in the report (``describe()["conversions"]``). FlashMLA plans its own split-KV;
a pinned plan of our API is accepted and not applied (``FlashMLAPlan`` never equals one of ours, so a comparison with
ours is always "a different plan"). Without the package, CUDA, or an SM90/SM100 GPU, binding any target raises
:class:`SubjectUnavailable` with the reason: every row is ``skipped``.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import re
import sys

from contracts.subjects.base import EntryMissing, Family, Subject, SubjectUnavailable, _CALL_TIMER
from impl import formats
from impl.decode import DecodePlan, DecodeWorkspace
from impl.targets import get_target

#: a folder to put on sys.path before importing ``flash_mla`` (e.g. the wheel unzipped into ``.fmla/``)
PATH_ENV = "SMV_FLASHMLA_PATH"
PACKAGE = "flash_mla"
DIST = "sgl-flash-mla"
KV_FORMAT = "V4"
#: FlashMLA's index tile: a dense index list's width must be a multiple of it (learned again if it says otherwise)
TOPK_MULTIPLE = 64
HEAD_GROUP = 64  # h_q must be 64 or 128: smaller head counts are padded to 64
BLOCK_ALIGN = formats.DSV4_BLOCK_ALIGN  # k_cache.stride(0) must be a multiple of this
BASE_ALIGN = 16  # bytes
#: what this host has learned from FlashMLA's own refusals (see prepare_decode): index width multiple, block size
LEARNED: dict = {"topk_multiple": TOPK_MULTIPLE, "block_size": None}
#: the conversions this adapter makes where FlashMLA needs them (each listed in the report, with the ones this
#: process applied): {id: why}
CONVERSION_RULES = {
    "invalid-indices-to-minus-one": "entries outside [0, num_slots) (invalid in our API) are passed as -1: FlashMLA "
                                    "treats only -1 as invalid and does no bound check",
    "cache-realigned": "a cache view whose block stride is not a multiple of 576 B or whose base is not 16 B aligned "
                       "is copied into a padded pool (same block size, same bytes)",
    "cache-regrouped": "if FlashMLA refuses a block size, the cache is copied into 64-token blocks (slot ids "
                       "unchanged)",
    "heads-padded": "head counts other than 64/128 run in groups of 64 heads, padded with zero queries and -inf "
                    "sinks (FlashMLA takes h_q 64 or 128)",
    "index-tile": "index lists are -1-padded to a multiple of FlashMLA's tile (64, or what FlashMLA asks for)",
}
#: every conversion applied so far in this process: {id: why}
CONVERSIONS: dict = {}

ENTRY = "decode.sparse_attn_decode"


def _note(cid: str, why: str) -> None:
    CONVERSIONS.setdefault(cid, why)


# --- finding and loading the package ---------------------------------------------------------------------------

def add_search_path(path: str | None = None) -> str | None:
    """Put ``path`` (default: ``$SMV_FLASHMLA_PATH``) first on sys.path; the folder, or None when none is named.
    A named folder that does not exist is a :class:`SubjectUnavailable`."""
    path = path if path is not None else os.environ.get(PATH_ENV)
    if not path:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise SubjectUnavailable(f"{PATH_ENV}={path} is not a folder (expected the one holding flash_mla/)")
    if path not in sys.path:
        sys.path.insert(0, path)
        importlib.invalidate_caches()
    return path


def package_info(path: str | None = None) -> tuple[str | None, str | None]:
    """(version, folder) of the ``flash_mla`` package this process would import, without importing it; (None,
    None) when it is not installed."""
    try:
        add_search_path(path)
    except SubjectUnavailable:
        return None, None
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.origin:
        return None, None
    folder = os.path.dirname(spec.origin)
    try:
        with open(os.path.join(folder, "VERSION")) as fh:
            return fh.read().strip(), folder
    except OSError:
        from importlib import metadata

        try:
            return metadata.version(DIST), folder
        except metadata.PackageNotFoundError:
            return "unknown", folder


def unavailable_reason(path: str | None = None, *, device=None) -> str | None:
    """Why FlashMLA's sparse decode cannot run here (one line), or None when it can: not installed, no CUDA (a CPU
    or ROCm host), a GPU that is not SM90/SM100, or a legacy extension that does not load."""
    try:
        add_search_path(path)
    except SubjectUnavailable as exc:
        return str(exc)
    version, _ = package_info(path)
    if version is None:
        return (f"FlashMLA is not installed (pip install 'sparse-mla-verify[flashmla]', or name the folder holding "
                f"flash_mla/ in {PATH_ENV})")
    import torch

    if getattr(torch.version, "hip", None):
        return "FlashMLA runs on NVIDIA GPUs only (this is a ROCm build of torch)"
    if not torch.cuda.is_available():
        return "no CUDA device (FlashMLA's kernels run on NVIDIA SM90/SM100 only)"
    cc = torch.cuda.get_device_capability(device)
    if cc[0] not in (9, 10):
        return f"compute capability {cc[0]}.{cc[1]}: FlashMLA's sparse decode needs SM90 or SM100"
    try:
        mod = importlib.import_module(PACKAGE)
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason, not a traceback
        return f"flash_mla does not import: {type(exc).__name__}: {exc}"
    if not mod.has_legacy():
        return "flash_mla's legacy extension (the SM90 and V4-format kernels) did not load"
    return None


_LOADED: list = []


def load():
    """The imported ``flash_mla`` module (checked once per process); :class:`SubjectUnavailable` with the reason
    when it cannot run here."""
    if not _LOADED:
        why = unavailable_reason()
        if why:
            raise SubjectUnavailable(why)
        _LOADED.append(importlib.import_module(PACKAGE))
    return _LOADED[0]


# --- our inputs -> FlashMLA's tensors ----------------------------------------------------------------------------

def cache_is_acceptable(cache) -> bool:
    """Whether FlashMLA can read our ``[nb, bs, 584]`` view as it is: each block contiguous (our API's rule too),
    ``stride(0)`` a multiple of 576 (or a single block), the base 16 B aligned."""
    formats.check_fp8_ds_mla_cache(cache)
    stride_ok = cache.shape[0] <= 1 or cache.stride(0) % BLOCK_ALIGN == 0
    return stride_ok and cache.data_ptr() % BASE_ALIGN == 0


def repack_cache(cache, block_size: int | None = None, chunk: int = 1 << 15):
    """A fresh padded ``[nb', bs', 584]`` copy of ``cache`` holding every slot's bytes at the same slot id: the same
    block size (``block_size`` None) block by block, or regrouped into ``block_size``-token blocks (slot s at block
    s // bs', position s % bs', so the indices do not change), ``chunk`` slots at a time."""
    layout = formats.check_fp8_ds_mla_cache(cache)
    nb, bs = int(cache.shape[0]), layout.block_size
    if block_size is None or block_size == bs:
        _, out = formats.allocate_fp8_ds_mla_pool(nb, bs, device=cache.device)
        used = layout.used_block_bytes
        src = cache.as_strided((nb, used), (cache.stride(0), 1))
        out.as_strided((nb, used), (out.stride(0), 1)).copy_(src)
        return out
    slots = nb * bs
    _, out = formats.allocate_fp8_ds_mla_pool(-(-slots // block_size), block_size, device=cache.device)
    for first in range(0, slots, chunk):
        n = min(chunk, slots - first)
        for src, dst in zip(_slot_bytes(cache, first, n), _slot_bytes(out, first, n)):
            dst[1][dst[0]] = src[1][src[0]]
    return out


def _slot_bytes(cache, first: int, n: int):
    """For slots [first, first + n) of a cache view: (byte offsets, flat byte view) of their 576 data bytes and of
    their 8 scale bytes, in slot order (int64 offsets from the view's first byte)."""
    import torch

    bs = int(cache.shape[1])
    layout = formats.Fp8DsMlaLayout(bs)
    flat = cache.as_strided(((int(cache.shape[0]) - 1) * cache.stride(0) + layout.used_block_bytes,), (1,))
    s = torch.arange(first, first + n, device=cache.device, dtype=torch.int64)
    base, pos = (s // bs) * cache.stride(0), s % bs
    data = base + pos * formats.DSV4_TOKEN_DATA_BYTES
    scale = base + layout.scale_region_offset + pos * formats.DSV4_TOKEN_SCALE_BYTES
    return [((off[:, None] + torch.arange(width, device=cache.device)).reshape(-1), flat)
            for off, width in ((data, formats.DSV4_TOKEN_DATA_BYTES), (scale, formats.DSV4_TOKEN_SCALE_BYTES))]


def flashmla_cache(cache, block_size: int | None = None):
    """Our cache view as FlashMLA's ``k_cache`` [nb, bs, 1, 584]: the same bytes where FlashMLA accepts them (see
    :func:`cache_is_acceptable`), else a padded copy (:func:`repack_cache`, regrouped into ``block_size``-token
    blocks when given). None stays None."""
    if cache is None:
        return None
    if block_size is not None and block_size != int(cache.shape[1]):
        _note("cache-regrouped", f"FlashMLA refused block size {int(cache.shape[1])}: the cache is copied into "
                                 f"{block_size}-token blocks (slot ids unchanged)")
        cache = repack_cache(cache, block_size)
    elif not cache_is_acceptable(cache):
        _note("cache-realigned", "a cache view whose block stride is not a multiple of 576 B or whose base is not "
                                 "16 B aligned is copied into a padded pool (same block size, same bytes)")
        cache = repack_cache(cache)
    return cache.unsqueeze(2)


def flashmla_indices(indices, indptr, num_slots: int, multiple: int | None = None):
    """(dense [b, 1, W] int32, lengths [b] int32): row r's entries ``indices[indptr[r]:indptr[r+1]]`` first, -1
    after them; W is the longest row rounded up to ``multiple`` (at least one tile). Entries outside
    [0, num_slots) - invalid in our API, masked by our kernels - become -1, the only invalid index FlashMLA knows.
    A decreasing indptr is a ValueError naming it."""
    import torch

    multiple = multiple or LEARNED["topk_multiple"]
    ptr = indptr.to(torch.int64)
    lens = ptr[1:] - ptr[:-1]
    if bool((lens < 0).any()):
        raise ValueError(f"indptr: expected non-decreasing offsets, got {indptr.tolist()}")
    longest = int(lens.max()) if lens.numel() else 0
    width = max(multiple, -(-longest // multiple) * multiple)
    j = torch.arange(width, device=indices.device, dtype=torch.int64)
    inside = j[None, :] < lens[:, None]
    src = (ptr[:-1, None] + j[None, :]).clamp(0, max(indices.numel() - 1, 0))
    vals = indices.reshape(-1).to(torch.int64)[src] if indices.numel() else torch.full_like(src, -1)
    valid = inside & (vals >= 0) & (vals < num_slots)
    if bool((inside & ~valid).any()):
        _note("invalid-indices-to-minus-one", "entries outside [0, num_slots) (invalid in our API) are passed as -1: "
                                              "FlashMLA treats only -1 as invalid and does no bound check")
    dense = torch.where(valid, vals, torch.full_like(vals, -1)).to(torch.int32)
    return dense.unsqueeze(1).contiguous(), lens.to(torch.int32).contiguous()


def flashmla_sink(attn_sink, heads: int, padded_heads: int, device):
    """The sink as FlashMLA's [padded_heads] fp32: our first ``heads`` values (our API's may be longer), -inf (no
    sink) for the padding heads; None (no sink) stays None."""
    import torch

    if attn_sink is None:
        return None
    if attn_sink.numel() < heads:
        raise ValueError(f"attn_sink: expected at least {heads} values, got {attn_sink.numel()}")
    out = torch.full((padded_heads,), -math.inf, dtype=torch.float32, device=device)
    out[:heads] = attn_sink.reshape(-1)[:heads].to(torch.float32)
    return out


def head_groups(heads: int) -> list[tuple[int, int, int]]:
    """(first head, heads in the group, padded heads) per FlashMLA call: 64 or 128 heads as they are, otherwise
    groups of 64 with the last one padded."""
    if heads in (64, 128):
        return [(0, heads, heads)]
    return [(h0, min(HEAD_GROUP, heads - h0), HEAD_GROUP) for h0 in range(0, heads, HEAD_GROUP)]


# --- the call ------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Prepared:
    """One decode's inputs in FlashMLA's shapes, per head group, and its scheduler state (kept between calls, so a
    replayed call - a CUDA graph - reuses it as FlashMLA's wrapper allows: same shapes, same lengths)."""

    groups: list
    main: object
    main_idx: object
    main_len: object
    extra: object
    extra_idx: object
    extra_len: object
    scale: float


def prepare_decode(fm, q, main_cache, main_indices, main_indptr, extra_cache=None, extra_indices=None,
                   extra_indptr=None, attn_sink=None, softmax_scale=None, block_size=None) -> Prepared:
    """Our decode's arguments converted to FlashMLA's (see the module docstring); nothing runs."""
    import torch

    if q.dtype != torch.bfloat16 or q.dim() != 3 or q.shape[2] != formats.DSV4_HEAD_DIM:
        raise ValueError(f"q: expected a [b, h, {formats.DSV4_HEAD_DIM}] bfloat16 tensor, got "
                         f"{list(q.shape)} {q.dtype}")
    heads = int(q.shape[1])
    scale = formats.DSV4_HEAD_DIM ** -0.5 if softmax_scale is None else float(softmax_scale)
    main = flashmla_cache(main_cache, block_size)
    mi, ml = flashmla_indices(main_indices, main_indptr, int(main_cache.shape[0] * main_cache.shape[1]))
    extra = ei = el = None
    if extra_cache is not None:
        extra = flashmla_cache(extra_cache, block_size)
        ei, el = flashmla_indices(extra_indices, extra_indptr, int(extra_cache.shape[0] * extra_cache.shape[1]))
    groups = []
    for h0, n, padded in head_groups(heads):
        qg = torch.zeros(q.shape[0], 1, padded, formats.DSV4_HEAD_DIM, dtype=torch.bfloat16, device=q.device)
        qg[:, 0, :n] = q[:, h0:h0 + n]
        sink = flashmla_sink(attn_sink[h0:] if attn_sink is not None else None, n, padded, q.device)
        groups.append({"h0": h0, "n": n, "q": qg, "sink": sink, "sched": fm.get_mla_metadata()[0]})
    if any(g["n"] != g["q"].shape[2] for g in groups):
        _note("heads-padded", "head counts other than 64/128 run in groups of 64 heads, padded with zero queries "
                              "and -inf sinks (FlashMLA takes h_q 64 or 128)")
    return Prepared(groups, main, mi, ml, extra, ei, el, scale)


def run_prepared(fm, p: Prepared, out=None):
    """FlashMLA's sparse decode for every head group; the [b, h, 512] output: copied into ``out`` when given, else
    FlashMLA's own output tensor where one unpadded group covers every head (no copy: what a benchmark times), else a
    new tensor."""
    import torch

    for g in p.groups:
        o, _lse = fm.flash_mla_with_kvcache(
            g["q"], p.main, None, None, formats.DSV4_HEAD_DIM, g["sched"], softmax_scale=p.scale,
            is_fp8_kvcache=True, indices=p.main_idx, attn_sink=g["sink"], extra_k_cache=p.extra,
            extra_indices_in_kvcache=p.extra_idx, topk_length=p.main_len, extra_topk_length=p.extra_len,
            use_legacy=True, kv_format=KV_FORMAT)
        if out is None and len(p.groups) == 1 and g["n"] == g["q"].shape[2]:
            return o[:, 0]
        if out is None:
            heads = p.groups[-1]["h0"] + p.groups[-1]["n"]
            out = torch.empty(o.shape[0], heads, formats.DSV4_HEAD_DIM, dtype=torch.bfloat16, device=o.device)
        out[:, g["h0"]:g["h0"] + g["n"]] = o[:, 0, :g["n"]]
    return out


_TILE_RE = re.compile(r"(?:mod B_TOPK \(|must be a multiple of )(\d+)")


def learn_from(exc: BaseException) -> bool:
    """Whether FlashMLA's refusal names a conversion this module can make (a wider index tile, 64-token blocks):
    it is learned (:data:`LEARNED`) and the call is worth repeating once."""
    text = str(exc)
    m = _TILE_RE.search(text)
    if m and int(m.group(1)) != LEARNED["topk_multiple"] and int(m.group(1)) > 0:
        LEARNED["topk_multiple"] = int(m.group(1))
        _note("index-tile", f"FlashMLA asked for index lists a multiple of {m.group(1)} wide")
        return True
    if "page_block_size must be 64" in text and LEARNED["block_size"] != 64:
        LEARNED["block_size"] = 64
        return True
    return False


def decode(q, main_cache, main_indices, main_indptr, extra_cache=None, extra_indices=None, extra_indptr=None, *,
           attn_sink=None, softmax_scale=None, out=None, fm=None):
    """Our ``sparse_attn_decode`` arguments through FlashMLA: prepare, run (once more after a refusal it can
    convert for), return ``out``."""
    import torch

    fm = fm or load()
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], formats.DSV4_HEAD_DIM, dtype=torch.bfloat16, device=q.device)
    if q.shape[0] == 0 or q.shape[1] == 0:
        return out
    for attempt in range(3):
        p = prepare_decode(fm, q, main_cache, main_indices, main_indptr, extra_cache, extra_indices, extra_indptr,
                           attn_sink, softmax_scale, LEARNED["block_size"])
        try:
            run_prepared(fm, p, out)
            return out
        except RuntimeError as exc:
            if attempt == 2 or not learn_from(exc):
                raise
    return out


# --- the subject ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FlashMLAPlan(DecodePlan):
    """Our plan type as FlashMLA's family hands it out: FlashMLA schedules its own split-KV, so ``num_splits`` is
    the most splits its scheduler can give one query row (one per 64-token tile of the row's indices, at most one
    per SM): the split count the contracts' error model assumes. Never equal to one of ours (another class)."""


def _plan_decode(target, batch, num_heads, main_numel, extra_numel=0, *, adaptive_splits=False, cu_count=None):
    import torch

    tile = LEARNED["topk_multiple"]
    tiles = -(-int(main_numel) // tile) + -(-int(extra_numel) // tile)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else tiles
    return FlashMLAPlan("flashmla", max(1, min(tiles, sms)), len(head_groups(max(int(num_heads), 1))))


class _FlashBound:
    """FlashMLA's entry points on one target, as our API's families: ``decode`` only."""

    def __init__(self, target):
        self.target = target

    def __getattr__(self, family: str):
        if family.startswith("_"):
            raise AttributeError(family)
        if family != "decode":
            raise EntryMissing(family, "FlashMLA has only the DSv4 sparse decode (flash_mla_with_kvcache)")
        bound_target = self.target

        def sparse_attn_decode(q, main_cache, main_indices, main_indptr, extra_cache=None, extra_indices=None,
                               extra_indptr=None, *, attn_sink=None, softmax_scale=None, target=None,
                               adaptive_splits=False, trust_extra_nan_free=False, cu_count=None, plan=None,
                               workspace=None, out=None, check_indptr=True):
            # the plan, split-K workspace, CU count and trust gate are our kernels' knobs: FlashMLA has none of them
            if target is not None:
                _require_ocp(get_target(target))
            _require_ocp(bound_target)
            return decode(q, main_cache, main_indices, main_indptr, extra_cache, extra_indices, extra_indptr,
                          attn_sink=attn_sink, softmax_scale=softmax_scale, out=out)

        return Family("decode", sparse_attn_decode=sparse_attn_decode, plan_decode=_plan_decode,
                      DecodePlan=FlashMLAPlan, DecodeWorkspace=DecodeWorkspace)


def _require_ocp(t) -> None:
    if t.main_cache_fp8 != "ocp" or t.extra_cache_fp8 != "ocp":
        raise SubjectUnavailable(f"{ENTRY} on {t.name}: FlashMLA reads OCP e4m3 caches only, and {t.name}'s main "
                                 f"cache is {t.main_cache_fp8.upper()}")


class FlashMLASubject(Subject):
    """FlashMLA from the installed package or a named folder (``flashmla@PATH``, or ``$SMV_FLASHMLA_PATH``)."""

    def __init__(self, path: str | None = None):
        self.path = path
        reason = unavailable_reason(path)
        version, folder = package_info(path)
        super().__init__("flashmla", version or "not-installed", folder or (path or ""))
        self.reason = reason

    def bind(self, target):
        t = get_target(target)
        if self.reason:
            raise SubjectUnavailable(f"{ENTRY}: {self.reason}")
        _require_ocp(t)
        return _CALL_TIMER[0](_FlashBound(t))

    def describe(self) -> dict:
        d = super().describe()
        d["entry_points"] = [ENTRY, "decode.plan_decode (FlashMLA's split bound, for the error model)"]
        d["conversions"] = [{"id": k, "why": v, "applied_here": k in CONVERSIONS}
                            for k, v in sorted(CONVERSION_RULES.items())]
        d["not_run"] = [{"what": "V3.2 fp8_ds_mla (656 B) sparse decode", "why": "no contract covers that format"},
                        {"what": "the sparse prefill (flash_mla_sparse_fwd)", "why": "no contract covers it"}]
        if self.reason:
            d["unavailable"] = self.reason
        return d


def flashmla_subject(spec: str) -> FlashMLASubject:
    """``flashmla`` (installed, or ``$SMV_FLASHMLA_PATH``) or ``flashmla@PATH`` (the folder holding flash_mla/)."""
    from contracts.subjects.base import SubjectSpecError

    s = spec.strip()
    if s == "flashmla":
        return FlashMLASubject()
    if s.startswith("flashmla@"):
        path = s[len("flashmla@"):].strip()
        if not path:
            raise SubjectSpecError("flashmla@: give the folder that holds flash_mla/ after the @")
        return FlashMLASubject(path)
    raise SubjectSpecError(f"unknown subject {spec!r}: expected flashmla or flashmla@PATH")
