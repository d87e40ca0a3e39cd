"""The fp8 paged indexer logits (``rocm_fp8_paged_mqa_logits``) on a host without AITER: loading the dispatcher,
building an indexer cache of known keys in the layout a writer uses, calling it with an all-ones query, and the
formula the logits should follow. Needs the ``upstream`` snippet before it."""
import types

import torch


def load_paged_logits(module, arch, **platform_flags):
    """``(mod, dispatch, fp8)``: ``module`` loaded as a ROCm ``arch`` whose AITER switchboard reports AITER off
    (``platform_flags`` set on top of ``vllm.platforms.rocm``), its ``rocm_fp8_paged_mqa_logits`` and its
    ``FP8_DTYPE``."""
    overrides = rocm_overrides(arch)
    overrides["vllm._aiter_ops"] = {"rocm_aiter_ops": types.SimpleNamespace(
        is_enabled=lambda: False, is_rdna_aiter_enabled=lambda: False)}
    overrides["vllm.platforms.rocm"].update(platform_flags)
    mod, dispatch, fp8 = load_names(module, overrides, "rocm_fp8_paged_mqa_logits", "FP8_DTYPE")
    if not isinstance(fp8, torch.dtype):
        raise CannotRun(f"{module}'s FP8_DTYPE is not a torch dtype: {fp8!r}")
    return mod, dispatch, fp8


def fp8_indexer_cache(fp8, keys, block_size, dim, device, num_blocks=1, shuffled=False):
    """A ``[num_blocks, block_size, 1, dim + 4]`` uint8 indexer cache, every block alike: token t holds
    ``keys[t] = (value, scale)``, the fp8 ``value`` in every lane and the fp32 ``scale``; tokens past ``keys`` are
    zero bytes. A block holds its ``block_size * dim`` value bytes, then its ``block_size`` fp32 scales (4 bytes at
    ``block_size * dim + 4t``). The values lie token after token (block-flat: token t's lanes at ``dim * t``), or,
    with ``shuffled``, in the SHUFFLE layout of 16x16 tiles of (token, lane): value d of token t at byte
    ``((t // 16 * dim // 16 + d // 16) * 16 + t % 16) * 16 + d % 16``."""
    block = torch.zeros(block_size * (dim + 4), dtype=torch.uint8)
    lanes = torch.arange(dim)
    for t, (value, scale) in enumerate(keys):
        code = torch.tensor([value]).to(fp8).view(torch.uint8)[0]
        if shuffled:
            block[((t // 16 * (dim // 16) + lanes // 16) * 16 + t % 16) * 16 + lanes % 16] = code
        else:
            block[t * dim + lanes] = code
        block[block_size * dim + 4 * t:block_size * dim + 4 * t + 4] = torch.tensor([scale]).view(torch.uint8)
    return torch.stack([block] * num_blocks).reshape(num_blocks, block_size, 1, dim + 4).to(device)


def paged_logits_of_ones(dispatch, fp8, cache, next_n, context, max_model_len, compress_ratio, raised_ok=False):
    """Upstream's paged logits over every block of ``cache`` (block table [0, 1, ...]) for one request of
    ``context`` tokens: ``next_n`` queries of one head, fp8 1.0 in every lane, head weight 1.0. What the call
    returned, or, with ``raised_ok``, the ``Raised`` it raised (else an exception stops the script with
    CannotRun)."""
    device = cache.device
    num_blocks, _, _, width = cache.shape
    q = torch.ones(1, next_n, 1, width - 4).to(fp8).to(device)
    weights = torch.ones(next_n, 1, dtype=torch.float32, device=device)
    context_lens = torch.tensor([context], dtype=torch.int32, device=device)
    block_tables = torch.arange(num_blocks, dtype=torch.int32, device=device).reshape(1, num_blocks)
    got = call_upstream(dispatch, q, cache, weights, context_lens, block_tables, None, max_model_len,
                        compress_ratio=compress_ratio)
    if isinstance(got, Raised) and not raised_ok:
        raise CannotRun(f"upstream's paged logits raised: {got!r}")
    return got


def formula_scores(keys, dim):
    """Each key's logit for the all-ones query of head weight 1.0: weight * relu(q . k) * scale."""
    return [1.0 * max(dim * value, 0.0) * scale for value, scale in keys]


def first_row_scores(got, keys, dim):
    """``(seen, expected, wrong)``: query row 0's logits of the keys, the formula's, and the keys where they
    differ."""
    expected = formula_scores(keys, dim)
    seen = got.detach().float().cpu()[0][:len(keys)].tolist()
    return seen, expected, [k for k in range(len(keys)) if seen[k] != expected[k]]
