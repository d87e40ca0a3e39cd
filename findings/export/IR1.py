"""IR1: on a ROCm device other than gfx942/gfx950, a bf16-wo_a DSv4 layer never inverse-RoPEs its decode rows. The
fallback decode kernel does not apply the rotation, but `rocm_sparse_attn_decode` reports every row as rotated.
`forward_mqa` therefore starts its standalone pass after those rows.

Input: upstream's `DeepseekV4ROCMAiterMLAAttention.forward_mqa` on a gfx90a device (MI200: neither gfx942/gfx950,
nor gfx1250, nor RDNA), run on a layer stand-in that holds only the attributes the method reads. The layer is
SWA-only (compress ratio 1) with a bf16 wo_a (no fp8 wo_a weight, so `fuse_inv_rope` is true), AITER off and 2
heads. The step is 1 decode token and no prefill; position 5. Upstream's real `_forward_decode`,
`rocm_sparse_attn_decode` (and its fallback Triton kernel) and `rocm_inverse_rope_rows_` run. The SWA cache is one
fp8_ds_mla block of 64 tokens. The decode token sees one cached token, slot 0, whose NoPE codes are 0 and whose 64
RoPE lanes hold bf16 values. cos_sin_cache is [8, 64] (cos | sin). The reference for "unrotated" is the same
decode call made again with no positions, into a scratch output. The check is therefore independent of the
attention values themselves. On a CPU they come from Triton's interpreter, whose bf16 `tl.dot` is not a GPU's, so
they are off there; a GPU gives the token's [0 x 448 | rope] row.

Observed: `rocm_sparse_attn_decode` returns 1 (row 0 reported as rotated). Only `_sparse_attn_decode_ragged_kernel`
runs, and it never receives the positions. The standalone pass is handed rows [1, 1), which is empty. Row 0 leaves
the layer with its RoPE lanes unrotated.

Expected: row 0's RoPE lanes are inverse-rotated exactly once at position 5 (even' = a*cos + b*sin,
odd' = b*cos - a*sin on each pair (a, b)): either in the decode, or by the standalone pass when the decode reports
0 rotated rows.

Suggested fix: have `rocm_sparse_attn_decode` report only rows a kernel actually rotated: return 0 on the fallback
path, e.g. `return output.shape[0] if inv_rope_positions is not None and (_ON_GFX942 or _ON_GFX950) else 0`.
Alternatively, pass positions to the decode in `forward_mqa` only on gfx942/gfx950. 0.33.0 has the same code; only
gfx1250 is excluded there, so RDNA is affected too. 0.34.0 also excludes RDNA, but the other fallback architectures
remain.
"""
import types

import torch

SHARED = ["rope"]
MODULE = "vllm/models/deepseek_v4/amd/rocm.py"
OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     "    return output.shape[0] if inv_rope_positions is not None else 0\n",
     "    return (\n        output.shape[0]\n        if inv_rope_positions is not None and (_ON_GFX942 or _ON_GFX950)\n"
     "        else 0\n    )\n"),
]

ARCH = "gfx90a"
HEADS, HEAD, NOPE, ROPE = 2, 512, 448, 64
BLOCK, TOKEN_BYTES, DATA_BYTES = 64, 584, 576  # fp8_ds_mla: 448 fp8 + 64 bf16 per token, 8 scale bytes at the end
POSITION = 5


class _HostAsDevice(torch.Tensor):
    """A CPU tensor that answers ``is_cpu`` False. Under the interpreter it stands for device memory, so that
    the decode wrapper's device guard lets the interpreted kernel run. Only used when no GPU is present."""

    @property
    def is_cpu(self):
        return False


def reproduce(args):
    device = args.device
    overrides = rocm_overrides(ARCH)
    overrides["vllm.platforms.rocm"].update(on_gfx1250=lambda: False, on_rdna=lambda: False)
    mod = load_upstream(MODULE, overrides=overrides, also_real=[OPS])
    cls = getattr(mod, "DeepseekV4ROCMAiterMLAAttention", None)
    for name in ("rocm_sparse_attn_decode", "rocm_inverse_rope_rows_"):
        if not callable(getattr(mod, name, None)):
            raise CannotRun(f"{MODULE} does not import {name} from {OPS}")
    if cls is None or not hasattr(cls, "forward_mqa") or not hasattr(cls, "_forward_decode"):
        raise CannotRun(f"{MODULE} has no DeepseekV4ROCMAiterMLAAttention.forward_mqa / _forward_decode")

    def dev(t):
        t = t.to(device)
        return t.as_subclass(_HostAsDevice) if device == "cpu" else t

    gen = torch.Generator().manual_seed(3)
    rope_vals = (torch.randn(ROPE, generator=gen) * 2).to(torch.bfloat16)
    cache = torch.zeros(1, BLOCK, TOKEN_BYTES, dtype=torch.uint8)
    flat = cache.view(-1)
    flat[NOPE:DATA_BYTES] = rope_vals.view(torch.uint8)  # slot 0: NoPE codes 0, RoPE lanes
    flat[BLOCK * DATA_BYTES:BLOCK * DATA_BYTES + 7] = 127  # its 7 e8m0 NoPE scales: 1.0
    cos_sin = random_cos_sin(gen, 8, ROPE)
    q = dev((torch.randn(1, HEADS, HEAD, generator=gen) * 0.1).to(torch.bfloat16))
    output = dev(torch.zeros(1, HEADS, HEAD, dtype=torch.bfloat16))
    positions = dev(torch.tensor([POSITION], dtype=torch.int64))

    swa = types.SimpleNamespace(
        num_decodes=1, num_prefills=0, num_decode_tokens=1, num_prefill_tokens=0, num_actual_tokens=1,
        decode_swa_indices=dev(torch.zeros(1, 1, dtype=torch.int32)),
        decode_swa_lens=dev(torch.ones(1, dtype=torch.int32)),
        decode_swa_ragged_indices=dev(torch.zeros(1, dtype=torch.int32)),
        decode_swa_ragged_indptr=dev(torch.tensor([0, 1], dtype=torch.int32)))
    layer = types.SimpleNamespace(
        prefix="attn", swa_cache_layer=types.SimpleNamespace(prefix="swa", kv_cache=dev(cache)),
        compress_ratio=1, kv_cache=None, _wo_a_fp8_weight=None, n_local_heads=HEADS,
        _use_aiter_sparse_mla=False, _use_aiter_sparse_mla_decode=False, _use_aiter_sparse_mla_prefill=False,
        rotary_emb=types.SimpleNamespace(cos_sin_cache=dev(cos_sin)), head_dim=HEAD, nope_head_dim=NOPE,
        rope_head_dim=ROPE, attn_sink=None, scale=HEAD ** -0.5, kv_cache_dtype="fp8_ds_mla", _has_kv_transfer=False)
    layer._forward_decode = types.MethodType(cls._forward_decode, layer)

    seen = {"claimed": None, "standalone": [], "plain": None}
    real_decode, real_rows = mod.rocm_sparse_attn_decode, mod.rocm_inverse_rope_rows_

    def decode(*a, **k):
        seen["claimed"] = real_decode(*a, **k)
        # the reference: the same decode with no positions (no rotation asked for), into a scratch output
        plain = dev(torch.zeros(1, HEADS, HEAD, dtype=torch.bfloat16))
        real_decode(*a, **{**k, "output": plain, "inv_rope_positions": None})
        seen["plain"] = plain
        return seen["claimed"]

    def standalone(o, pos, cos_sin_cache, rope_head_dim):
        start = (o.storage_offset() - output.storage_offset()) // output.stride(0)
        seen["standalone"].append((start, start + int(o.shape[0])))
        return real_rows(o, pos, cos_sin_cache, rope_head_dim)

    mod.rocm_sparse_attn_decode, mod.rocm_inverse_rope_rows_ = decode, standalone
    mod.get_forward_context = lambda: types.SimpleNamespace(attn_metadata={"swa": swa})
    got = call_upstream(cls.forward_mqa, layer, q, None, positions, output)
    if isinstance(got, Raised):
        raise CannotRun(f"forward_mqa did not run on the stand-in layer: {got!r}")
    if seen["claimed"] is None:
        raise CannotRun("forward_mqa did not reach rocm_sparse_attn_decode")
    if device != "cpu":
        torch.cuda.synchronize()
    out = output.cpu().as_subclass(torch.Tensor).to(torch.float64)[0]
    plain = seen["plain"].cpu().as_subclass(torch.Tensor).to(torch.float64)[0]
    if not bool(torch.isfinite(plain).all()) or bool((plain[:, NOPE:] == 0).all()):
        raise CannotRun("the decode's output without positions is not finite and nonzero: nothing to compare")
    want = inverse_rope(plain, cos_sin[POSITION], NOPE)
    tol = 2 ** -7 * (plain.abs() + want.abs())[:, NOPE:] + 1e-6
    rotated_once = bool(((out[:, NOPE:] - want[:, NOPE:]).abs() <= tol).all())
    unrotated = bool(((out[:, NOPE:] - plain[:, NOPE:]).abs() <= tol).all())
    passes = ", ".join(f"[{s}, {e})" for s, e in seen["standalone"]) or "none"
    state = ("unrotated" if unrotated else "inverse-rotated once" if rotated_once
             else "neither unrotated nor rotated once")
    observed = (f"rocm_sparse_attn_decode returned {seen['claimed']} (rows it reports rotated); standalone pass got "
                f"rows {passes}; row 0's RoPE lanes leave the layer {state} (head 0 lane {NOPE}: "
                f"{out[0, NOPE].item():.6g}; the decode without positions gives {plain[0, NOPE].item():.6g})")
    expected = (f"row 0's RoPE lanes = the decode's attention output inverse-rotated once at position {POSITION} "
                f"(head 0 lane {NOPE}: {want[0, NOPE].item():.6g}), by the decode or by the standalone pass")
    note = ("(no GPU: Triton's interpreter computed the attention values, and its bf16 tl.dot is not a GPU's, so the "
            "magnitudes are off; the check compares the layer's output with the same decode's own output without "
            "positions, which does not depend on them)") if device == "cpu" else ""
    return Verdict(not rotated_once, observed, expected, note=note)
