"""Per-layer metadata of one DSv4 decode step: the glue between the scheduler's block tables and the kernels.

A DSv4 attention layer is SWA-only (``compress_ratios[layer]`` 0 or 1), C4A (4) or C128A (128) (SPEC 1.3). Every
layer keeps its last ``window`` tokens in an SWA ("main") cache with its own block table of ``swa_block_size``
tokens per block; a compressed layer also keeps one row per ``ratio`` tokens in a compressed ("extra") cache whose
block table is the attention metadata's, of ``block_size`` *tokens* per block, i.e. ``block_size // ratio`` rows
per block (SPEC 1.3: ROCm passes ``attn_metadata.block_size // compress_ratio``).

For one decode step (one query token per row, at ``positions[t]`` of request ``token_to_req[t]``) this computes
what upstream's metadata builders and ``_forward_decode`` compute from those tables (vllm-project/vllm
``vllm/v1/attention/backends/mla/compressor_utils.py`` ``get_compressed_slot_mapping``,
``vllm/models/deepseek_v4/sparse_mla.py`` ``build_c128a_topk_metadata``, ``vllm/models/deepseek_v4/amd/rocm.py``
``_forward_decode``, restated in SPEC 1.3 and 2):

- ``swa_slot_mapping``: where the SWA insert writes the token: slot = swa_table[req, pos // sbs] * sbs + pos % sbs,
  -1 for a padding token (position < 0) or a block id < 0; a token with slot -1 is not valid
  (``is_valid_token``);
- ``compressed_slot_mapping`` (compressed layers): a token completes compressed row pos // ratio when
  (pos + 1) % ratio == 0 and then writes it at table[req, row // cbs] * cbs + row % cbs (cbs = block_size // ratio);
  every other token, and every invalid one, maps to -1;
- ``topk_block_size`` (compressed layers): the compressed block size the C4A global-slot conversion
  (``impl.ragged.compute_global_topk_ragged_indices_and_indptr``) maps local row ids with;
- ``c128a_topk`` / ``c128a_lens`` (C128A): every compressed row so far, n = min((pos + 1) // 128, width) of them
  (the row completed by this very token included: the compressor runs before the attention), as global slots in a
  dense ``[T, width]`` int32 row padded with -1; lens 0 for an invalid token. ``width`` is
  ``c128a_max_compressed(max_model_len)``;
- ``indexer_context_lens`` (C4A): the compressed rows the indexer scores, (pos + 1) // 4, 0 for an invalid token;
- ``indexer_layout`` (C4A): the layout of the indexer-K cache, which its writer (the head-128 compressor) and its
  readers (the paged logits, the gather) must both be given: C4A's cache is block-flat, NORMAL
  (``impl.prefill_assembly.indexer_k_layout_for_ratio``), where a reader's default for a block size above 1 is
  SHUFFLE.

- ``window_positions``: the positions the SWA window helper (``impl.ragged.compute_swa_indices_and_lens``) is
  handed: the token's position where it is valid, -1 (an empty window) where it is not, so a token the SWA table
  does not map reads nothing (upstream's ``_compute_swa_indices_and_lens_kernel`` gives an invalid token length 0).
- ``for_cudagraph_capture``: the metadata was built for a graph capture on a target whose decode then uses
  adaptive splits (gfx950; seed 004 item 2).

``Dsv4MetadataBuilder`` is the per-layer builder (upstream's ``DeepseekV4ROCMAiterMLASparseMetadataBuilder`` in
vllm/models/deepseek_v4/amd/rocm.py, one per attention layer kind): ``build(...)`` the metadata of a step
(``for_cudagraph_capture`` False) and ``build_for_cudagraph_capture(...)`` the same with ``for_cudagraph_capture``
set to whether the target takes the adaptive graph path (upstream: ``_ON_GFX950``; False on gfx942 and elsewhere,
so their captured decodes keep the eager plan). ``step_epilogue`` is what the step runs on a decode output: the
inverse GPT-J RoPE at the tokens' positions, then, for the MXFP8 output (gfx950's fp8 output projection), the
MXFP8 quantization of the rotated rows.

Everything is torch on the tensors' device; arguments are validated first (ValueError/TypeError naming them).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from impl.epilogues import inverse_rope_gptj, mxfp8_quantize
from impl.prefill_assembly import indexer_k_layout_for_ratio
from impl.targets import Target, get_target
from impl.validation import require_kernel_device, require_tensor

#: ``compress_ratios[layer]`` of the three layer kinds (0 and 1 are both SWA-only; vLLM uses max(1, ratio))
LAYER_KINDS = {1: "swaonly", 4: "c4a", 128: "c128a"}
#: C128A rows per dense row are padded to a multiple of this (SPEC 1.3, ``_C128A_TOPK_ALIGNMENT``)
C128A_TOPK_ALIGNMENT = 128


def layer_kind(compress_ratio: int) -> str:
    """"swaonly", "c4a" or "c128a" for ``compress_ratios[layer]`` (0 and 1 are SWA-only)."""
    if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int):
        raise TypeError(f"compress_ratio: expected an int, got {type(compress_ratio).__name__}")
    kind = LAYER_KINDS.get(max(1, compress_ratio)) if compress_ratio >= 0 else None
    if kind is None:
        raise ValueError(f"compress_ratio: expected 0, 1, 4 or 128, got {compress_ratio}")
    return kind


def c128a_max_compressed(max_model_len: int, ratio: int = 128) -> int:
    """Width of a C128A dense row: ceil(max_model_len / ratio) rounded up to a multiple of 128 (SPEC 1.3)."""
    _require_positive("max_model_len", max_model_len)
    n = -(-max_model_len // ratio)
    return max(1, -(-n // C128A_TOPK_ALIGNMENT)) * C128A_TOPK_ALIGNMENT


@dataclass(frozen=True)
class LayerStepMetadata:
    """What one layer's decode step needs besides the caches (see the module docstring)."""

    kind: str
    ratio: int
    swa_slot_mapping: torch.Tensor          # int64 [T]
    is_valid_token: torch.Tensor            # bool [T]
    compressed_slot_mapping: torch.Tensor | None = None  # int64 [T]
    topk_block_size: int | None = None
    c128a_topk: torch.Tensor | None = None  # int32 [T, width]
    c128a_lens: torch.Tensor | None = None  # int32 [T]
    indexer_context_lens: torch.Tensor | None = None  # int32 [T]
    indexer_layout: str | None = None
    window_positions: torch.Tensor | None = None  # int64 [T]
    for_cudagraph_capture: bool = False


def _require_positive(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {v}")
    return v


def _lookup(table: torch.Tensor, req: torch.Tensor, index: torch.Tensor, block_size: int) -> torch.Tensor:
    """table[req, index // bs] * bs + index % bs (int64), -1 where index < 0, the column lies past the table or
    the block id is negative."""
    R, W = table.shape
    col = torch.div(index, block_size, rounding_mode="floor")
    ok = (index >= 0) & (col < W)
    if R and W:
        blk = table[req.clamp(0, R - 1), col.clamp(0, W - 1)].to(torch.int64)
    else:
        blk = torch.full_like(index, -1)
    ok = ok & (blk >= 0)
    slot = blk * block_size + torch.remainder(index, block_size)
    return torch.where(ok, slot, torch.full_like(slot, -1))


def build_layer_metadata(compress_ratio: int, positions: torch.Tensor, token_to_req: torch.Tensor,
                         swa_block_table: torch.Tensor, swa_block_size: int, *,
                         block_table: torch.Tensor | None = None, block_size: int | None = None,
                         max_model_len: int | None = None) -> LayerStepMetadata:
    """The metadata of one layer for a decode step (module docstring).

    ``positions`` int64 [T] (< 0: a padding token), ``token_to_req`` int32/int64 [T] (rows of the tables),
    ``swa_block_table`` int32 [R, W]; a compressed layer also needs ``block_table`` int32 [R, Wc] and
    ``block_size`` (the attention block size in tokens, a multiple of the ratio); C128A needs ``max_model_len``.
    """
    kind = layer_kind(compress_ratio)
    ratio = max(1, compress_ratio)
    require_tensor("positions", positions, (torch.int64,), dim=1)
    T = positions.shape[0]
    require_tensor("token_to_req", token_to_req, (torch.int32, torch.int64), dim=1)
    if token_to_req.shape[0] != T:
        raise ValueError(f"token_to_req: expected {T} entries (one per position), got {token_to_req.shape[0]}")
    require_tensor("swa_block_table", swa_block_table, (torch.int32, torch.int64), dim=2)
    _require_positive("swa_block_size", swa_block_size)
    for name, t in (("token_to_req", token_to_req), ("swa_block_table", swa_block_table)):
        if t.device != positions.device:
            raise ValueError(f"{name}: expected device {positions.device} (the device of positions), got {t.device}")
    req = token_to_req.to(torch.int64)
    if T and (int(req.min()) < 0 or int(req.max()) >= swa_block_table.shape[0]):
        raise ValueError(f"token_to_req: expected request rows in [0, {swa_block_table.shape[0]}), got "
                         f"{req.tolist()}")
    swa_slots = _lookup(swa_block_table, req, positions, swa_block_size)
    valid = swa_slots >= 0
    window_positions = torch.where(valid, positions, torch.full_like(positions, -1))
    if kind == "swaonly":
        return LayerStepMetadata(kind, ratio, swa_slots, valid, window_positions=window_positions)

    if block_table is None or block_size is None:
        raise ValueError(f"block_table, block_size: a {kind} layer needs the compressed cache's block table and "
                         "the attention block size")
    require_tensor("block_table", block_table, (torch.int32, torch.int64), dim=2)
    if block_table.device != positions.device:
        raise ValueError(f"block_table: expected device {positions.device}, got {block_table.device}")
    if block_table.shape[0] != swa_block_table.shape[0]:
        raise ValueError(f"block_table: expected {swa_block_table.shape[0]} rows (one per request, as "
                         f"swa_block_table), got {block_table.shape[0]}")
    _require_positive("block_size", block_size)
    if block_size % ratio:
        raise ValueError(f"block_size: expected a multiple of the compress ratio {ratio}, got {block_size}")
    states_per_block = block_size // ratio
    completes = valid & (torch.remainder(positions + 1, ratio) == 0)
    row = torch.div(positions, ratio, rounding_mode="floor")
    comp_slots = _lookup(block_table, req, row, states_per_block)
    comp_slots = torch.where(completes, comp_slots, torch.full_like(comp_slots, -1))
    n_rows = torch.where(valid, torch.div(positions + 1, ratio, rounding_mode="floor"),
                         torch.zeros_like(positions))
    meta = dict(compressed_slot_mapping=comp_slots, topk_block_size=block_size // ratio)
    meta["window_positions"] = window_positions
    if kind == "c4a":
        meta["indexer_context_lens"] = n_rows.to(torch.int32)
        meta["indexer_layout"] = indexer_k_layout_for_ratio(ratio, states_per_block)
    else:
        if max_model_len is None:
            raise ValueError("max_model_len: a c128a layer needs it (the width of its dense rows)")
        width = c128a_max_compressed(max_model_len, ratio)
        lens = n_rows.clamp(max=width)
        j = torch.arange(width, device=positions.device, dtype=torch.int64)[None, :]
        slots = _lookup(block_table, req[:, None].expand(T, width), j.expand(T, width), states_per_block)
        slots = torch.where(j < lens[:, None], slots, torch.full_like(slots, -1))
        meta["c128a_topk"] = slots.to(torch.int32)
        meta["c128a_lens"] = lens.to(torch.int32)
    return LayerStepMetadata(kind, ratio, swa_slots, valid, **meta)


class Dsv4MetadataBuilder:
    """The metadata builder of one DSv4 attention layer kind (module docstring): its compress ratio, the SWA block
    size, the attention block size and model length of a compressed layer, and the target, fixed at construction;
    ``build`` / ``build_for_cudagraph_capture`` take a step's positions, token-to-request map and block tables."""

    def __init__(self, compress_ratio: int, *, swa_block_size: int, block_size: int | None = None,
                 max_model_len: int | None = None, target: "Target | str | None" = None):
        self.kind = layer_kind(compress_ratio)
        self.compress_ratio = compress_ratio
        self.swa_block_size = _require_positive("swa_block_size", swa_block_size)
        self.block_size, self.max_model_len = block_size, max_model_len
        self.target = get_target(target)

    def build(self, positions: torch.Tensor, token_to_req: torch.Tensor, swa_block_table: torch.Tensor,
              block_table: torch.Tensor | None = None) -> LayerStepMetadata:
        """The step's metadata (``build_layer_metadata``), ``for_cudagraph_capture`` False."""
        return build_layer_metadata(self.compress_ratio, positions, token_to_req, swa_block_table,
                                    self.swa_block_size, block_table=block_table, block_size=self.block_size,
                                    max_model_len=self.max_model_len)

    def build_for_cudagraph_capture(self, positions: torch.Tensor, token_to_req: torch.Tensor,
                                    swa_block_table: torch.Tensor,
                                    block_table: torch.Tensor | None = None) -> LayerStepMetadata:
        """``build``, for the step a graph captures: ``for_cudagraph_capture`` is whether the target's captured
        decode takes the adaptive path (gfx950)."""
        meta = self.build(positions, token_to_req, swa_block_table, block_table)
        return dataclasses.replace(meta, for_cudagraph_capture=self.target.adaptive_splits_in_capture)


def step_epilogue(out: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor, *, mxfp8: bool = False,
                  rotated: torch.Tensor | None = None):
    """The epilogue of a decode output ``out [T, H, 512]``: the inverse GPT-J RoPE at ``positions`` into
    ``rotated`` (allocated when None), then with ``mxfp8`` the MXFP8 quantization of the rotated rows. Returns
    ``(rotated, codes, scales)`` (``codes`` / ``scales`` None without ``mxfp8``)."""
    if not isinstance(mxfp8, bool):
        raise TypeError(f"mxfp8: expected a bool, got {type(mxfp8).__name__}")
    # checked here under this function's names (inverse_rope_gptj calls them x and out)
    for name, t in (("out", out), ("rotated", rotated)):
        if t is not None:
            require_tensor(name, t, (torch.float32, torch.bfloat16), dim=3)
            require_kernel_device(name, t)
            if t.stride(2) != 1:
                raise ValueError(f"{name}: expected a unit stride on the last dimension, got {list(t.stride())}")
    if rotated is not None and rotated.shape != out.shape:
        raise ValueError(f"rotated: expected the shape of out {list(out.shape)}, got {list(rotated.shape)}")
    require_tensor("positions", positions, (torch.int32, torch.int64), dim=1, device=out.device)
    # a padding token (position -1) attended to nothing: its row is rotated at position 0 and discarded
    rot = inverse_rope_gptj(out, cos_sin, positions.clamp(min=0), out=rotated)
    if not mxfp8:
        return rot, None, None
    codes, scales = mxfp8_quantize(rot)
    return rot, codes, scales
