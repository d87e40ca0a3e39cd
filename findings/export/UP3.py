"""UP3: when the gfx950 OPUS guard holds, the sparse prefill hands a caller's ragged index list to AITER's OPUS op as
it is, so -1 entries and slots past the kv length reach an op that requires every entry to be a valid kv row.

Input: gfx950. `rocm_sparse_attn_prefill` with ragged_indices = [5, -2] and ragged_indptr = [0, 2, 2, ..., 2]
(query 0 owns both entries, the other queries none), kv of 4 rows ([4, 1, 576] bf16), q and output [1024, 1, 576]
bf16 (1024 queries: the guard's threshold), an fp32 attention sink of one head, scale 0.1, head dims 512 + 64. AITER's
`pa_sparse_prefill_opus` is stood in by a recorder of what it is handed (the script never runs a real OPUS kernel);
the Triton fallback `_rocm_sparse_attn_prefill_ragged_triton` is stood in by a recorder too, since only the route is
observed. On a CPU host the query tensor answers `is_cuda` as True (the one part of upstream's guard
`_can_use_aiter_sparse_prefill_opus` a CPU cannot satisfy); on a GPU it is a real device tensor and the guard runs
unchanged.

Observed: the guard holds and OPUS is handed the entries [5, -2] for query 0: 5 is past the 4 kv rows and -2 is a
masked slot. The dense path compacts its rows to valid entries before OPUS (`build_ragged_indices_from_dense`), but
ragged input bypasses that.

Expected: every entry OPUS is handed is a valid kv row (in [0, 4)): here query 0 has no valid entry, so OPUS gets an
empty list for it (the row then carries only the sink's share, as the Triton fallback computes by masking both
entries), or the call is not routed to OPUS at all. ROCm/aiter's `pa_sparse_prefill_opus` documents that every index
must be a valid row of its source; an invalid one is an out-of-bounds read on the device.

Suggested fix: compact a caller's ragged list to its valid entries before the OPUS call, as the dense path does
(keep = (indices >= 0) & (indices < kv.shape[0]); the new indptr is the zero-padded cumsum of keep sampled at the
old indptr), or, the smallest change, send ragged input to the Triton path, which masks invalid entries: add
`and (ragged_indices is None or ragged_indptr is None)` to the OPUS condition in `rocm_sparse_attn_prefill`.
"""
import torch

SHARED = ["upstream"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     "        and _get_aiter_sparse_prefill_opus() is not None\n    ):\n",
     "        and _get_aiter_sparse_prefill_opus() is not None\n"
     "        and (ragged_indices is None or ragged_indptr is None)\n    ):\n"),
]
SKV, HEADS, NOPE, ROPE = 4, 1, 512, 64
ENTRIES = [5, -2]  # query 0's ragged entries: one past the kv rows, one masked slot


class _OnDevice(torch.Tensor):
    """A CPU tensor that answers ``is_cuda`` as True: on a host without a GPU, the one condition of upstream's OPUS
    guard that cannot hold otherwise. Every other property is the tensor's own."""

    @property
    def is_cuda(self):
        return True


def reproduce(args):
    device = args.device
    mod, entry, _ = load_names(MODULE, rocm_overrides("gfx950"), "rocm_sparse_attn_prefill",
                               "_get_aiter_sparse_prefill_opus")
    if getattr(mod, "_ON_GFX950", None) is not True:
        raise CannotRun("the module does not see gfx950 (the OPUS guard would be false)")

    handed, fallback = [], []

    def opus(q, kv, indices, indptr, *rest, **kw):
        """Stands in for AITER's pa_sparse_prefill_opus: records the list it is handed."""
        handed.append((indices.detach().cpu().clone(), indptr.detach().cpu().clone()))

    def triton_fallback(*a, **kw):
        fallback.append(True)
        return kw.get("out")

    mod._get_aiter_sparse_prefill_opus = lambda: opus
    mod._rocm_sparse_attn_prefill_ragged_triton = triton_fallback

    sq = int(getattr(mod, "_GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES", 1024))
    d = NOPE + ROPE
    q = torch.randn(sq, HEADS, d).to(torch.bfloat16).to(device)
    kv = torch.randn(SKV, 1, d).to(torch.bfloat16).to(device)
    out = torch.empty_like(q)
    sink = torch.zeros(HEADS, dtype=torch.float32, device=device)
    indices = torch.tensor(ENTRIES, dtype=torch.int32, device=device)
    indptr = torch.full((sq + 1,), len(ENTRIES), dtype=torch.int32, device=device)
    indptr[0] = 0
    if device == "cpu":
        q = torch.Tensor._make_subclass(_OnDevice, q)
    got = call_upstream(entry, q=q, kv=kv, indices=None, topk_length=None, scale=0.1, head_dim=d,
                        nope_head_dim=NOPE, rope_head_dim=ROPE, attn_sink=sink, output=out,
                        ragged_indices=indices, ragged_indptr=indptr)
    if isinstance(got, Raised) and not handed:
        raise CannotRun(f"upstream's prefill raised before any route: {got!r}")

    # the expected value, inline: query 0's valid entries are those in [0, SKV)
    valid = [e for e in ENTRIES if 0 <= e < SKV]
    expected = (f"OPUS handed only kv rows in [0, {SKV}) (query 0's valid entries: {valid}), or the Triton "
                f"fallback, which masks {ENTRIES}")
    if not handed:
        return Verdict(False, f"not routed to OPUS ({'the Triton fallback ran' if fallback else 'no route seen'})",
                       expected)
    idx, ptr = handed[0]
    span = idx[int(ptr[0]):int(ptr[-1])].tolist()
    bad = [e for e in span if not 0 <= e < SKV]
    return Verdict(bool(bad), f"OPUS handed the entries {span} (indptr [{int(ptr[0])}, {int(ptr[1])}, ..., "
                              f"{int(ptr[-1])}]); not kv rows: {bad}", expected)
