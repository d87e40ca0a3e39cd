"""References for the DSv4 sparse prefill (SPEC section 3, seed 003), written from SPEC.md.

1. ``ref_sparse_attn_prefill``: float64 attention over the gathered kv rows. Dense indices become ragged by SPEC's
   rule (``oracles.ragged.ref_ragged_from_dense``: the first clamp(topk_length or count(idx >= 0), 0, k) entries of
   each row); an entry is valid when it lies in its row's range and 0 <= slot < skv. One softmax over the row's valid
   entries plus the sink as an extra logit with a zero value; V = K (all d lanes); an empty row without a sink gives
   0. No NaN scrub: prefill reads an already dequantized kv. Besides the output it returns what the comparison's
   error model needs (``oracles.compare``).
2. ``prefill_tolerance``: ``oracles.compare``'s error model with the prefill's parameters - the QK dot over all d
   lanes, SPEC 3's BLOCK_K (``spec_block_k``), one split - and the units of the input dtype; fp16 adds an absolute
   underflow floor (see ``prefill_error_model``).
3. ``opus_guard_expected``: the OPUS routing guard as a table of named conditions, each read off SPEC 3's list,
   over plain attributes (strings, tuples), never over tensors and never through impl/.
4. ``aiter_pa_guard_expected`` / ``ref_aiter_pa_rows``: the gfx942 AITER ``pa_prefill_sparse`` route of SPEC 10 -
   its guard as a table of named conditions, and the index rows the op is handed (dense rows converted as for
   OPUS, a caller's ragged rows as they are).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import dataclasses

import torch

from oracles import compare as cmp
from oracles.decode import DecodeReference
from oracles.ragged import ref_ragged_from_dense

# --- attention --------------------------------------------------------------------------------------------------


@dataclass
class PrefillReference(DecodeReference):
    """The decode reference's fields per query row (out is float64 [sq, h, out_width]), plus ragged: the
    (indices, indptr) lists the dense input converted to (None for ragged input), and v_abs_sum: float64
    [sq, out_width], per row and lane sum_j |v_j| over the valid entries (the fp16 underflow floor)."""

    ragged: tuple[list[int], list[int]] | None
    v_abs_sum: torch.Tensor


def ref_dense_to_ragged(dense: list[list[int]], topk_length: list[int] | None, skv: int):
    """SPEC 2/3's dense -> ragged conversion with the slot check: kept values outside [0, skv) become -1."""
    return ref_ragged_from_dense(dense, topk_length, skv)


def ref_opus_ragged(indices: list[int], indptr: list[int], skv: int) -> tuple[list[int], list[int]]:
    """What OPUS may be handed: each row's valid entries (0 <= slot < skv) in order, packed, indptr from 0."""
    out, ptr = [], [0]
    for r in range(len(indptr) - 1):
        row = [int(s) for s in indices[indptr[r]:indptr[r + 1]] if 0 <= int(s) < skv]
        out += row
        ptr.append(ptr[-1] + len(row))
    return out, ptr


def ref_sparse_attn_prefill(q: torch.Tensor, kv: torch.Tensor, *, softmax_scale: float,
                            attn_sink: torch.Tensor | None, out_width: int,
                            dense: list[list[int]] | None = None, topk_length: list[int] | None = None,
                            indices: list[int] | None = None, indptr: list[int] | None = None) -> PrefillReference:
    """Float64 sparse prefill of q [sq, h, d] over kv [skv, d] (or [skv, 1, d]); give ``dense`` (+ optional
    ``topk_length``) or ``indices`` + ``indptr`` as Python lists."""
    sq, h, d = q.shape
    q64 = q.detach().cpu().to(torch.float64)
    kv64 = kv.detach().cpu().to(torch.float64).reshape(kv.shape[0], d)
    skv = kv64.shape[0]
    ragged = None
    if dense is not None:
        indices, indptr = ref_dense_to_ragged(dense, topk_length, skv)
        ragged = (list(indices), list(indptr))
    if attn_sink is None:
        sink = torch.full((h,), -math.inf, dtype=torch.float64)
    else:
        sink = attn_sink.detach().cpu().to(torch.float64)[:h]
    out = torch.zeros(sq, h, out_width, dtype=torch.float64)
    wabs = torch.zeros(sq, h, out_width, dtype=torch.float64)
    labs = torch.zeros(sq, h, dtype=torch.float64)
    lmax = torch.zeros(sq, h, dtype=torch.float64)
    vsum = torch.zeros(sq, out_width, dtype=torch.float64)
    tokens, max_abs_v = [], []
    idx_all = torch.as_tensor(list(indices), dtype=torch.int64)
    ptr = list(indptr)
    for r in range(sq):
        seg = idx_all[ptr[r]:ptr[r + 1]]  # the row's entries (a Python slice's rules), then the valid ones
        g = kv64[seg[(seg >= 0) & (seg < skv)]]  # [n, d]
        n = g.shape[0]
        tokens.append(n)
        fin = g[torch.isfinite(g)]
        max_abs_v.append(float(fin.abs().max()) if fin.numel() else 0.0)
        s = softmax_scale * (q64[r][:, None, :] * g[None, :, :]).sum(-1)  # [h, n]
        s_abs = abs(softmax_scale) * (q64[r].abs()[:, None, :] * g.abs()[None, :, :]).sum(-1)
        finite_s = torch.isfinite(s)
        labs[r] = torch.where(finite_s, s_abs, torch.zeros_like(s_abs)).amax(-1) if n else 0.0
        cand = torch.cat([torch.where(finite_s, s.abs(), torch.zeros_like(s)),
                          torch.where(torch.isfinite(sink), sink.abs(), torch.zeros_like(sink))[:, None]], dim=1)
        lmax[r] = cand.amax(-1)
        m = torch.maximum(s.amax(-1), sink) if n else sink.clone()
        v = g[:, :out_width]
        vsum[r] = v.abs().sum(0) if n else 0.0
        # every head at once: 0 where m == -inf (no finite logit and no sink), NaN where m is NaN, else
        # p = e^(s - m) / (sum e^(s - m) + e^(sink - m)), out = sum p v, wabs = sum p |v| (0 without tokens)
        e = torch.exp(s - m[:, None])
        l_sum = e.sum(-1) + torch.exp(sink - m)
        p = e / l_sum[:, None]
        o = (p[:, :, None] * v[None, :, :]).sum(1)
        w = (p[:, :, None] * v.abs()[None, :, :]).sum(1)
        dead = (m == -math.inf)[:, None]
        nan = torch.isnan(m)[:, None]
        out[r] = torch.where(dead, 0.0, torch.where(nan, math.nan, o))
        wabs[r] = torch.where(dead, 0.0, torch.where(nan, math.nan, w))
    return PrefillReference(out, wabs, labs, lmax, tokens, max_abs_v, ragged, vsum)


# --- error model ------------------------------------------------------------------------------------------------

def spec_block_k(d: int) -> int:
    """SPEC 3: the Triton fallback walks BLOCK_K = 16 tokens per tile when d >= 256, else 32."""
    return 16 if d >= 256 else 32


#: fp16 unit roundoff (round to nearest: measured for the Triton interpreter's fp32 -> fp16 cast, numpy's
#: astype, and the GPU's default conversion alike)
U_FP16 = 2.0 ** -11
#: fp16's smallest subnormal; subnormals are kept (IEEE default; fp16 denormals are on by default on AMD GPUs)
FP16_SUBNORMAL = 2.0 ** -24


OUT_DTYPES = ("bfloat16", "float16", "float32")


def prefill_error_model(dtype: str, triton_mode: str, d: int, out_dtype: str | None = None
                        ) -> cmp.AttentionErrorModel:
    """``oracles.compare``'s model for a prefill with q and kv in ``dtype`` ("bfloat16" | "float16") and the
    output stored as ``out_dtype`` (None: ``dtype``; also "float32").

    bf16: ``AttentionErrorModel.for_mode`` with the QK dot over all d lanes. fp16: the same fp32 steps (q and k
    enter the dot exactly: an fp16 x fp16 product has 22 significant bits), but p is rounded to fp16 for the PV dot,
    relative U_FP16 = 2^-11 in the normal range (the interpreter's fp16 cast rounds to nearest, unlike its
    truncating bf16 cast). The output's rounding is its own dtype's: bf16 as ``for_mode`` says, fp16 U_FP16, fp32
    none (the fp32 result is stored as it is; the division's one fp32 rounding is in the model already). fp16's
    narrow exponent range, on either side, adds an absolute term the relative model cannot cover: see
    ``fp16_underflow_floor``."""
    base = cmp.AttentionErrorModel.for_mode(triton_mode)
    model = dataclasses.replace(base, dot_len=d)
    if dtype == "float16":
        model = dataclasses.replace(model, operand_unit=U_FP16, output_unit=U_FP16)
    elif dtype != "bfloat16":
        raise ValueError(f"dtype: expected 'bfloat16' or 'float16', got {dtype!r}")
    if out_dtype is not None:
        units = {"bfloat16": base.output_unit, "float16": U_FP16, "float32": 0.0}
        if out_dtype not in units:
            raise ValueError(f"out_dtype: expected one of {OUT_DTYPES} or None, got {out_dtype!r}")
        model = dataclasses.replace(model, output_unit=units[out_dtype])
    return model


def fp16_underflow_floor(ref: PrefillReference, heads: int) -> torch.Tensor:
    """Absolute fp16 error floor [sq, h, out_width]: 2^-25 * (1 + sum_j |v_jd|).

    Derivation. Below 2^-14 fp16 is subnormal with spacing 2^-24, so rounding to nearest moves a value by at most
    2^-25 there (and by at most U_FP16 relative above). (a) p: the kernel rounds p~_j = e^(s_j - m) to fp16, m the
    running max of the logits so far (the sink is folded in only after the last tile), so p~_j <= 1 but a logit
    more than ~17 below m gives a subnormal or zero p~_j: an error of up to 2^-25 absolute instead of U_FP16
    relative. Later tiles and the sink rescale it by alpha <= 1 and the division by l >= 1 (l counts the max term
    as 1) shrinks it, so on the output it is at most 2^-25 |v_jd| per token. (b) the output: when the sink
    dominates, out ~ e^(-sink) * v falls below fp16's range (sink 20 gives ~1e-8 < 2^-25, stored as 0), off by at
    most 2^-25. Together: 2^-25 * (1 + sum_j |v_jd|). bf16 has fp32's exponent range, where
    ``oracles.compare``'s floor already covers underflow."""
    half_spacing = FP16_SUBNORMAL / 2
    return (half_spacing * (1.0 + ref.v_abs_sum))[:, None, :].expand(-1, heads, -1).clone()


def prefill_tolerance(ref: PrefillReference, dtype: str, triton_mode: str, d: int,
                      out_dtype: str | None = None) -> torch.Tensor:
    """Per-lane tolerance [sq, h, out_width] of a prefill over ``dtype`` inputs, stored as ``out_dtype`` (None:
    ``dtype``), against ``ref``: ``oracles.compare``'s relative model (``prefill_error_model``; SPEC 3's BLOCK_K
    tokens per tile, one split, no split-K), plus the fp16 underflow floor (``fp16_underflow_floor``) when the
    inputs or the output are fp16 (p's rounding and the output's, either bounded by it); the steps after the
    underflow (fp32 rescales, sums and division, a few 2^-24 each, and an fp16 output rounding, U_FP16) scale that
    floor by at most 1 + 2 U_FP16. Lanes whose value an fp16 output cannot hold (|v| > 65504) are not modelled."""
    model = prefill_error_model(dtype, triton_mode, d, out_dtype)
    tol = cmp.attention_tolerance(ref.weight_abs, ref.logit_abs, ref.logit_max_abs, ref.tokens, ref.max_abs_v, 1,
                                  spec_block_k(d), model)
    if "float16" in (dtype, out_dtype):
        tol = tol + (1 + 2 * U_FP16) * fp16_underflow_floor(ref, int(ref.out.shape[1]))
    return tol


# --- OPUS routing guard -----------------------------------------------------------------------------------------

#: SPEC 3: OPUS runs only from this many query rows on (a measured performance crossover)
SPEC_OPUS_MIN_QUERIES = 1024
#: SPEC 3: the only architecture OPUS is routed on
SPEC_OPUS_ARCH = "gfx950"
SPEC_OPUS_DTYPES = ("bfloat16", "float16")


def _on_gpu(device: str) -> bool:
    return device.split(":")[0] == "cuda"  # ROCm tensors report the "cuda" device type


#: (condition, predicate over the attribute dict) - SPEC 3's list, one line each. Attributes: target (name),
#: q_shape/out_shape/kv_shape/sink_shape (tuples), q_dtype/kv_dtype/out_dtype/sink_dtype (names like "bfloat16"),
#: q_device/kv_device/out_device/sink_device (like "cuda:0", "cpu"), q_stride/kv_stride/out_stride (tuples);
#: sink_* are None when no sink is given.
OPUS_CONDITIONS = (
    ("target is gfx950", lambda a: a["target"] == SPEC_OPUS_ARCH),
    ("sq >= 1024", lambda a: a["q_shape"][0] >= SPEC_OPUS_MIN_QUERIES),
    ("q on the GPU", lambda a: _on_gpu(a["q_device"])),
    ("out.shape == q.shape", lambda a: tuple(a["out_shape"]) == tuple(a["q_shape"])),
    ("kv last dim == q last dim", lambda a: a["kv_shape"][-1] == a["q_shape"][-1]),
    ("q bf16 or fp16", lambda a: a["q_dtype"] in SPEC_OPUS_DTYPES),
    ("kv dtype == q dtype", lambda a: a["kv_dtype"] == a["q_dtype"]),
    ("out dtype == q dtype", lambda a: a["out_dtype"] == a["q_dtype"]),
    ("kv on q's device", lambda a: a["kv_device"] == a["q_device"]),
    ("out on q's device", lambda a: a["out_device"] == a["q_device"]),
    ("q last-dim stride 1", lambda a: a["q_stride"][-1] == 1),
    ("kv last-dim stride 1", lambda a: a["kv_stride"][-1] == 1),
    ("out.stride() == q.stride()", lambda a: tuple(a["out_stride"]) == tuple(a["q_stride"])),
    ("a sink is given", lambda a: a["sink_shape"] is not None),
    ("sink shape (h,)", lambda a: a["sink_shape"] is not None and tuple(a["sink_shape"]) == (a["q_shape"][1],)),
    ("sink fp32", lambda a: a["sink_dtype"] == "float32"),
    ("sink on q's device", lambda a: a["sink_device"] == a["q_device"]),
)


def opus_guard_failures(attrs: dict) -> list[str]:
    """The SPEC 3 conditions these attributes break (empty: OPUS may run)."""
    return [name for name, pred in OPUS_CONDITIONS if not pred(attrs)]


def opus_guard_expected(attrs: dict) -> bool:
    return not opus_guard_failures(attrs)


# --- gfx942 AITER pa_prefill_sparse route (SPEC 10) ----------------------------------------------------------------

#: SPEC 10: the gfx942 route runs from this many query rows on (a measured crossover against the Triton kernel)
SPEC_AITER_PA_MIN_QUERIES = 512
#: SPEC 10: ``get_cdna_version() == 3`` - CDNA 3 is gfx942 (MI300X / MI325X) among the targets
SPEC_AITER_PA_ARCH = "gfx942"
SPEC_AITER_PA_DTYPES = ("bfloat16", "float16")

#: (condition, predicate over the attribute dict) - SPEC 10's list, one line each, for a host whose AITER has MLA
#: enabled (the route's environment; without it the guard is false everywhere). Attributes: target (name),
#: q_shape (tuple), q_dtype / kv_dtype (names like "bfloat16"). Nothing else is asked: not the device, the layout,
#: the head dim, the sink or the output.
AITER_PA_CONDITIONS = (
    ("target is gfx942 (CDNA 3)", lambda a: a["target"] == SPEC_AITER_PA_ARCH),
    ("sq >= 512", lambda a: a["q_shape"][0] >= SPEC_AITER_PA_MIN_QUERIES),
    ("q bf16 or fp16", lambda a: a["q_dtype"] in SPEC_AITER_PA_DTYPES),
    ("kv dtype == q dtype", lambda a: a["kv_dtype"] == a["q_dtype"]),
)


def aiter_pa_guard_failures(attrs: dict) -> list[str]:
    """The SPEC 10 conditions these attributes break (empty: the gfx942 AITER route may run)."""
    return [name for name, pred in AITER_PA_CONDITIONS if not pred(attrs)]


def aiter_pa_guard_expected(attrs: dict) -> bool:
    return not aiter_pa_guard_failures(attrs)


def ref_aiter_pa_rows(skv: int, *, dense: list[list[int]] | None = None, topk_length: list[int] | None = None,
                      indices: list[int] | None = None, indptr: list[int] | None = None) -> list[list[int]]:
    """The index rows SPEC 10's route hands ``pa_prefill_sparse``, one list per query row. Dense input is converted
    "as the OPUS route does": each row's first clamp(topk_length or count(idx >= 0), 0, k) entries, of which only
    the valid ones (0 <= slot < skv) stay, in order. A caller's ragged list is passed through: row r is
    indices[indptr[r]:indptr[r+1]] as given, invalid entries included (AITER's gfx942 kernel skips -1 and slots
    past the pool)."""
    if dense is not None:
        idx, ptr = ref_opus_ragged(*ref_dense_to_ragged(dense, topk_length, skv), skv)
        return [list(idx[ptr[r]:ptr[r + 1]]) for r in range(len(ptr) - 1)]
    return [[int(s) for s in indices[indptr[r]:indptr[r + 1]]] for r in range(len(indptr) - 1)]
