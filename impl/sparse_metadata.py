"""DSv3.2 ROCm sparse-MLA metadata builder: persistent buffers, shrink-tail zeroing, a cached work partition.

Models ``ROCMAiterMLASparseMetadataBuilder`` (vllm-project/vllm ``vllm/v1/attention/backends/mla/
rocm_aiter_mla_sparse.py``; SPEC section 6, seed 000). Buffers are torch tensors on ``device`` (CPU here, any device
in production); the code is device-generic and counts its host synchronisations.

Extents of every persistent buffer after ``build()`` + ``fill_global_indices()`` (the ``shrink-tail-extents``
contract checks them against a builder that rewrites everything on every call):

============================ ======================================= =====================================
buffer                       live region (exactly a fresh build)     past the extent
============================ ======================================= =====================================
``req_id_per_token``         ``[0, T)``                              zero
``qo_indptr``                whole buffer (``arange``)               -
``paged_kv_last_page_len``   whole buffer (ones)                     -
``paged_kv_indptr``          whole buffer: cumsum, tail = ``nnz``    - (the tail gives padded tokens length 0)
``paged_kv_indices``         ``[0, nnz)``, ``nnz = indptr[T]``       zero
work partition buffers       see :mod:`impl.work_partition`          zero
============================ ======================================= =====================================

There is no gap: upstream tracks the extent of ``paged_kv_indices`` as ``T * topk`` and so leaves the stale ids of
earlier steps in ``[nnz, T * topk)``; here the extent is ``nnz`` (known on the host because the sparse lengths are
computed there), so that region is zeroed too. FINDINGS.md records the difference.

Cache key. Upstream keys ``get_mla_metadata_v1`` on ``(T, max_query_len, H, bytes(min(seq_lens_cpu, topk)))``. The
partition is a function of the per-token sparse lengths ``min(seq_len - q_len + offset + 1, topk)``, which that key
does not determine: the same clamped lengths with a different query-length distribution, or a prefill chunk that
starts below ``topk`` and ends above it, collide (FINDINGS.md). Our key is
``(T, max_query_len, H, bytes(request starts), bytes(min(seq_len, topk + q_len - 1)))``: per request, the start
offsets give the query lengths (with ``T``) and ``min(seq_len, topk + q_len - 1)`` with ``q_len`` determines every
token's sparse length exactly, while steady decode past ``topk`` still hits (the summary stays at ``topk``).

Missing ``seq_lens_cpu`` (the seed's unresolved review comment): the key is built from an explicit host copy of the
device ``seq_lens`` (one counted host sync). Bypassing the cache was the alternative; it needs the host lengths all
the same (the sparse lengths and the partition are computed on the host), so it would cost the same sync plus a
recompute every step. The builder never serves a partition keyed on anything but the lengths of this step.

Host syncs are counted in :class:`BuildCounters`: a cache hit with ``seq_lens_cpu`` present costs none; a recompute
costs exactly one (the stream is synchronised after the host-staged partition is copied, so the staging arrays may
be freed and a captured graph replay sees complete buffers); a missing ``seq_lens_cpu`` adds one for the copy.
``fill_global_indices(..., validate=True)`` on an accelerator adds one for reading the top-k rows on the host (the
default validates only rows that already live on the host; see its docstring).
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field

import numpy as np
import torch

from impl.targets import Target, aiter_status, effective_cu_count, get_target
from impl.work_partition import (
    DEFAULT_KV_GRANULARITY,
    PARTITION_BUFFERS,
    allocate_partition_buffers,
    compute_work_partition,
    write_work_partition,
)

#: ``hf_config.index_topk`` default of DSv3.2 (SPEC section 6).
DEFAULT_TOPK_TOKENS = 2048
#: AITER's MLA decode needs at least 16 heads; q is padded up to this (SPEC section 6).
MIN_MLA_HEADS = 16


@dataclass
class CommonMetadata:
    """The subset of vLLM's ``CommonAttentionMetadata`` the builder reads."""

    query_start_loc: torch.Tensor  # [R+1] int32, on the device
    query_start_loc_cpu: torch.Tensor  # [R+1] int32, host
    seq_lens: torch.Tensor  # [>= R] int32, on the device
    seq_lens_cpu: torch.Tensor | None  # host copy when the scheduler provides one
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    block_table: torch.Tensor  # [>= R, blocks] int32, on the device


@dataclass
class BuildCounters:
    """What ``build()`` cost: partition recomputes, cache hits, host syncs (and why)."""

    builds: int = 0
    recomputes: int = 0
    hits: int = 0
    host_syncs: int = 0
    sync_reasons: list[str] = field(default_factory=list)

    def snapshot(self) -> tuple[int, int, int, int]:
        return (self.builds, self.recomputes, self.hits, self.host_syncs)


@dataclass
class SparseMLAMetadata:
    num_reqs: int
    num_tokens: int
    max_query_len: int
    num_kv_entries: int  # nnz = paged_kv_indptr[num_tokens]
    topk_tokens: int
    block_size: int
    num_heads: int  # padded, max(16, heads)
    block_table: torch.Tensor
    req_id_per_token: torch.Tensor
    qo_indptr: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    paged_kv_indptr: torch.Tensor
    paged_kv_indices: torch.Tensor
    partition: dict[str, torch.Tensor]
    partition_from_aiter: bool
    cache_hit: bool
    #: host, per token: its own position in its request's context (``seq_len - q_len + offset``); the valid top-k
    #: positions of the token are ``0..context_positions[t]`` (negative for an empty sequence: none is valid).
    context_positions: np.ndarray | None = None


def padded_num_heads(num_heads: int) -> int:
    return max(MIN_MLA_HEADS, int(num_heads))


class SparseMLAMetadataBuilder:
    """Persistent sparse-MLA metadata for up to ``max_tokens`` tokens and ``topk_tokens`` entries per token.

    ``use_aiter``: call AITER's ``get_mla_metadata_v1`` (``aiter_module`` or the installed package) instead of our own
    partition; ``None`` (default) means whether real AMD AITER is importable; anything but a bool or ``None`` is a
    ``TypeError``. ``device``: where the buffers live; it must parse and allocate here (else ``ValueError``), and every
    device tensor ``build()``/``fill_global_indices()`` read must be on it. ``kv_granularity``: granule of the kv split
    (16, as upstream passes to AITER).
    """

    def __init__(self, max_tokens: int, num_heads: int, *, topk_tokens: int = DEFAULT_TOPK_TOKENS,
                 block_size: int = 1, target: "Target | str | None" = None, device="cpu",
                 kv_granularity: int = DEFAULT_KV_GRANULARITY, use_aiter: bool | None = None,
                 aiter_module: types.ModuleType | None = None, q_dtype: torch.dtype = torch.bfloat16,
                 kv_dtype: torch.dtype = torch.bfloat16):
        for name, value, low in (("max_tokens", max_tokens, 1), ("num_heads", num_heads, 1),
                                 ("topk_tokens", topk_tokens, 1), ("block_size", block_size, 1),
                                 ("kv_granularity", kv_granularity, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
        if use_aiter is not None and not isinstance(use_aiter, bool):
            raise TypeError(f"use_aiter: expected a bool or None, got {type(use_aiter).__name__} {use_aiter!r}")
        self.target = get_target(target)
        self.device = self._usable_device(device)
        self.max_tokens = max_tokens
        self.num_heads = num_heads
        self.num_heads_padded = padded_num_heads(num_heads)
        self.topk_tokens = topk_tokens
        self.block_size = block_size
        self.kv_granularity = kv_granularity
        self.num_cu = effective_cu_count(self.target)
        if use_aiter is None:
            use_aiter = aiter_module is not None or aiter_status().importable
        self.use_aiter = bool(use_aiter)
        self._aiter_module = aiter_module

        dev = self.device
        self.req_id_per_token = torch.zeros(max_tokens, dtype=torch.int32, device=dev)
        self.qo_indptr = torch.arange(0, max_tokens + 1, dtype=torch.int32, device=dev)
        self.paged_kv_last_page_len = torch.ones(max_tokens, dtype=torch.int32, device=dev)
        self.paged_kv_indices = torch.zeros(max_tokens * topk_tokens, dtype=torch.int32, device=dev)
        self.paged_kv_indptr = torch.zeros(max_tokens + 1, dtype=torch.int32, device=dev)
        self.partition = allocate_partition_buffers(max_tokens, self.num_cu, device=dev)
        if self.use_aiter:
            self.partition = self._aiter_partition_buffers(q_dtype, kv_dtype)

        self.counters = BuildCounters()
        self._prev_req_extent = 0
        self._prev_indices_extent = 0
        self._prev_partition_lengths: dict[str, int] | None = None
        self._prev_metadata_key: tuple | None = None

    @staticmethod
    def _usable_device(device) -> torch.device:
        """``device`` parsed and probed with an empty allocation; the probe also fills in the index of a bare
        ``"cuda"``, so that the same-device checks of ``build()`` compare like with like."""
        try:
            dev = torch.device(device)
        except (TypeError, RuntimeError) as e:
            raise ValueError(f"device: expected a torch device or its name (e.g. 'cpu', 'cuda:0'), got {device!r}: "
                             f"{e}") from None
        if dev.type == "meta":
            raise ValueError("device: expected a device with memory (the builder copies host data into its buffers), "
                             "got meta")
        try:
            return torch.empty(0, device=dev).device
        except (RuntimeError, AssertionError) as e:  # e.g. "Torch not compiled with CUDA enabled"
            raise ValueError(f"device: {device!r} is not usable in this process: {e}") from None

    # --- persistent state -----------------------------------------------------------------------------------------

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent buffer by name (partition buffers prefixed ``partition.``)."""
        out = {"req_id_per_token": self.req_id_per_token, "qo_indptr": self.qo_indptr,
               "paged_kv_last_page_len": self.paged_kv_last_page_len, "paged_kv_indptr": self.paged_kv_indptr,
               "paged_kv_indices": self.paged_kv_indices}
        out.update({f"partition.{k}": v for k, v in self.partition.items()})
        return out

    def invalidate_partition_cache(self) -> None:
        """Force the next ``build()`` to recompute the partition (benchmarks, tests)."""
        self._prev_metadata_key = None

    def _host_sync(self, reason: str) -> None:
        self.counters.host_syncs += 1
        self.counters.sync_reasons.append(reason)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _copy_seq_lens_to_host(self, seq_lens: torch.Tensor, num_reqs: int) -> np.ndarray:
        self._host_sync("seq_lens_cpu missing: explicit host copy of seq_lens")
        return seq_lens[:num_reqs].to("cpu").numpy().astype(np.int64)

    # --- validation -----------------------------------------------------------------------------------------------

    @staticmethod
    def _check_ints(name: str, t, ndim: int) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: expected dtype int32 or int64, got {str(t.dtype).replace('torch.', '')}")
        if t.dim() != ndim:
            raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {list(t.shape)}")

    @classmethod
    def _host_ints(cls, name: str, t, ndim: int = 1) -> np.ndarray:
        cls._check_ints(name, t, ndim)
        if t.device.type != "cpu":
            raise ValueError(f"{name}: expected a host (cpu) tensor, got one on {t.device}")
        return t.detach().numpy().astype(np.int64)

    def _device_ints(self, name: str, t, ndim: int = 1) -> torch.Tensor:
        """An int32/int64 tensor of ``ndim`` dimensions on the builder's device (checked without reading it)."""
        self._check_ints(name, t, ndim)
        if t.device != self.device:
            raise ValueError(f"{name}: expected a tensor on the builder's device {self.device}, got one on {t.device}")
        return t

    def _validate(self, common: CommonMetadata) -> tuple[int, int, int, np.ndarray, np.ndarray]:
        R, T, max_q = common.num_reqs, common.num_actual_tokens, common.max_query_len
        for name, value in (("num_reqs", R), ("num_actual_tokens", T), ("max_query_len", max_q)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: expected a non-negative int, got {value!r}")
        R, T, max_q = int(R), int(T), int(max_q)
        if T > self.max_tokens:
            raise ValueError(f"num_actual_tokens: expected at most max_tokens={self.max_tokens}, got {T}")
        starts = self._host_ints("query_start_loc_cpu", common.query_start_loc_cpu)
        if starts.shape[0] < R + 1:
            raise ValueError(f"query_start_loc_cpu: expected at least num_reqs + 1 = {R + 1} entries, "
                             f"got {starts.shape[0]}")
        starts = starts[:R + 1]
        q_lens = np.diff(starts)
        if starts[0] != 0 or (q_lens < 0).any():
            raise ValueError(f"query_start_loc_cpu: expected non-decreasing offsets from 0, got {starts.tolist()}")
        if starts[R] != T:
            raise ValueError(f"query_start_loc_cpu/num_actual_tokens disagree: offsets end at {int(starts[R])}, "
                             f"num_actual_tokens is {T}")
        if max_q != (int(q_lens.max()) if R else 0):
            raise ValueError(f"max_query_len: expected the largest query length {int(q_lens.max()) if R else 0}, "
                             f"got {max_q}")
        for name, t in (("query_start_loc", common.query_start_loc), ("seq_lens", common.seq_lens)):
            self._device_ints(name, t)
        if common.query_start_loc.shape[0] < R + 1:
            raise ValueError(f"query_start_loc: expected at least {R + 1} entries, got "
                             f"{common.query_start_loc.shape[0]}")
        if common.seq_lens.shape[0] < R:
            raise ValueError(f"seq_lens: expected at least num_reqs={R} entries, got {common.seq_lens.shape[0]}")
        bt = self._device_ints("block_table", common.block_table, ndim=2)
        if bt.shape[0] < R or bt.shape[1] < 1:
            raise ValueError(f"block_table: expected shape [>= num_reqs={R}, >= 1], got {list(bt.shape)}")
        seq_cpu = None
        if common.seq_lens_cpu is not None:
            seq_cpu = self._host_ints("seq_lens_cpu", common.seq_lens_cpu)
            if seq_cpu.shape[0] < R:
                raise ValueError(f"seq_lens_cpu: expected at least num_reqs={R} entries, got {seq_cpu.shape[0]}")
            seq_cpu = seq_cpu[:R]
        return R, T, max_q, starts, seq_cpu

    def _validate_seq_lens(self, seq_lens: np.ndarray, q_lens: np.ndarray, name: str = "seq_lens") -> None:
        if (seq_lens < 0).any():
            raise ValueError(f"{name}: expected non-negative lengths, got {seq_lens.tolist()}")
        short = (seq_lens > 0) & (seq_lens < q_lens)
        if short.any():
            r = int(np.nonzero(short)[0][0])
            raise ValueError(f"seq_lens/query lengths disagree: request {r} has seq_len {int(seq_lens[r])} < its "
                             f"query length {int(q_lens[r])} (only an empty sequence, seq_len 0, may be shorter)")

    # --- the build ------------------------------------------------------------------------------------------------

    @staticmethod
    def context_positions(q_lens: np.ndarray, seq_lens: np.ndarray) -> np.ndarray:
        """Per-token ``ctx_pos = seq_len - q_len + offset``: the token's own position in its request's context."""
        T = int(q_lens.sum())
        req = np.repeat(np.arange(q_lens.shape[0]), q_lens)
        first = np.repeat(np.cumsum(q_lens) - q_lens, q_lens)
        offset = np.arange(T) - first
        return (seq_lens[req] - q_lens[req] + offset).astype(np.int64)

    def sparse_lengths(self, q_lens: np.ndarray, seq_lens: np.ndarray) -> np.ndarray:
        """Per-token ``min(ctx_pos + 1, topk)`` with ``ctx_pos = seq_len - q_len + offset``; 0 for empty sequences."""
        req = np.repeat(np.arange(q_lens.shape[0]), q_lens)
        out = np.minimum(self.context_positions(q_lens, seq_lens) + 1, self.topk_tokens)
        return np.where(seq_lens[req] == 0, 0, out).astype(np.int64)

    def _partition_key(self, num_tokens: int, max_query_len: int, starts: np.ndarray, q_lens: np.ndarray,
                       seq_lens_host: np.ndarray) -> tuple:
        # min(seq_len, topk + q_len - 1) with q_len fixes every token's sparse length (see the module docstring).
        clamped = np.minimum(seq_lens_host, self.topk_tokens + q_lens - 1)
        return (num_tokens, max_query_len, self.num_heads_padded, starts[:-1].tobytes(), clamped.tobytes())

    def build(self, common: CommonMetadata) -> SparseMLAMetadata:
        """Fill the persistent buffers for this step; recompute the work partition only when the key changes.

        Bad input raises before anything is written (buffers and cache stay as they were)."""
        R, T, max_q, starts, seq_lens_host = self._validate(common)
        q_lens = np.diff(starts)
        given = seq_lens_host is not None  # seq_lens_cpu passed: the lengths checked are that argument's
        if seq_lens_host is None:
            seq_lens_host = self._copy_seq_lens_to_host(common.seq_lens, R)
        self._validate_seq_lens(seq_lens_host, q_lens, "seq_lens_cpu" if given else "seq_lens")
        self.counters.builds += 1

        sparse_lens = self.sparse_lengths(q_lens, seq_lens_host)
        kv_indptr = np.zeros(T + 1, dtype=np.int64)
        np.cumsum(sparse_lens, out=kv_indptr[1:])
        nnz = int(kv_indptr[T])

        # Shrink-tail: zero only what earlier steps wrote beyond the new extents.
        new_req_extent = T
        new_indices_extent = nnz
        if self._prev_req_extent > new_req_extent:
            self.req_id_per_token[new_req_extent:self._prev_req_extent].fill_(0)
        if self._prev_indices_extent > new_indices_extent:
            self.paged_kv_indices[new_indices_extent:self._prev_indices_extent].fill_(0)
        self._prev_req_extent = new_req_extent
        self._prev_indices_extent = new_indices_extent

        req_id = np.repeat(np.arange(R, dtype=np.int32), q_lens)
        self.req_id_per_token[:T].copy_(torch.from_numpy(req_id), non_blocking=True)
        self.paged_kv_indptr[:T + 1].copy_(torch.from_numpy(kv_indptr.astype(np.int32)), non_blocking=True)
        self.paged_kv_indptr[T + 1:].fill_(nnz)

        key_seq_lens = seq_lens_host
        key = self._partition_key(T, max_q, starts, q_lens, key_seq_lens)
        hit = key == self._prev_metadata_key
        if hit:
            self.counters.hits += 1
        else:
            if self.use_aiter:
                self._aiter_partition(T)
            else:
                live = compute_work_partition(kv_indptr, self.num_cu, self.kv_granularity)
                self._prev_partition_lengths = write_work_partition(self.partition, live,
                                                                    self._prev_partition_lengths)
            self._host_sync("work partition recomputed")
            self.counters.recomputes += 1
            self._prev_metadata_key = key

        return SparseMLAMetadata(
            num_reqs=R, num_tokens=T, max_query_len=max_q, num_kv_entries=nnz, topk_tokens=self.topk_tokens,
            block_size=self.block_size, num_heads=self.num_heads_padded, block_table=common.block_table,
            req_id_per_token=self.req_id_per_token[:T], qo_indptr=self.qo_indptr[:T + 1],
            paged_kv_last_page_len=self.paged_kv_last_page_len[:T], paged_kv_indptr=self.paged_kv_indptr[:T + 1],
            paged_kv_indices=self.paged_kv_indices[:T * self.topk_tokens], partition=self.partition,
            partition_from_aiter=self.use_aiter, cache_hit=hit,
            context_positions=self.context_positions(q_lens, seq_lens_host),
        )

    def _aiter(self) -> types.ModuleType:
        if self._aiter_module is None:
            import aiter  # noqa: PLC0415 - only present on ROCm

            self._aiter_module = aiter
        return self._aiter_module

    def _aiter_partition_buffers(self, q_dtype: torch.dtype, kv_dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """AITER's six work buffers, sized by ``get_mla_metadata_info_v1`` as upstream does (SPEC section 6); zeros."""
        sizes = self._aiter().get_mla_metadata_info_v1(self.max_tokens, 1, self.num_heads_padded, q_dtype, kv_dtype,
                                                       is_sparse=True, fast_mode=True)
        return {name: torch.zeros(size, dtype=dtype, device=self.device)
                for name, (size, dtype) in zip(PARTITION_BUFFERS, sizes)}

    def _aiter_partition(self, T: int) -> None:
        """AITER's closed partition, called as upstream does (SPEC section 6); its buffers are AITER's layout."""
        mod = self._aiter()
        p = self.partition
        mod.get_mla_metadata_v1(
            self.qo_indptr[:T + 1], self.paged_kv_indptr[:T + 1], self.paged_kv_last_page_len[:T],
            self.num_heads_padded, 1, True,
            p["work_meta"], p["work_info"], p["work_indptr"], p["reduce_indptr"], p["reduce_final_map"],
            p["reduce_partial_map"],
            page_size=1, kv_granularity=self.kv_granularity, max_seqlen_qo=1, uni_seqlen_qo=1, fast_mode=True,
        )

    # --- forward-time conversion ------------------------------------------------------------------------------------

    def fill_global_indices(self, metadata: SparseMLAMetadata, topk_indices: torch.Tensor, *,
                            validate: bool | None = None) -> torch.Tensor:
        """Write ``paged_kv_indices[0, nnz)`` from per-token top-k rows of request-local positions.

        Row ``t`` may hold ``-1`` holes anywhere (upstream assumes the valid entries are a prefix). Its valid entries
        are compacted in row order into ``[indptr[t], indptr[t+1])`` and converted to global slots
        ``block_table[req, pos // bs] * bs + pos % bs``; a row with fewer valid entries than its sparse length has the
        rest of its range set to ``-1``, which the consumer masks. No host sync: ``nnz`` is known from ``build()``.

        ``validate``: check the values of ``topk_indices`` before anything is written; every entry must be ``-1`` or a
        position inside both the token's context (``0..context_positions[t]``) and the block table
        (``< block_table.shape[1] * block_size``), else ``ValueError`` naming ``topk_indices``. The check reads the
        rows on the host, so on an accelerator it costs one host sync (counted in ``counters``). ``None`` (default):
        check when ``topk_indices`` lives on the host, where it costs no sync; skip it on an accelerator, where an
        invalid position is unchecked (past the context it becomes a global slot, past the block table the gather
        faults). ``True``: always check; ``False``: never.
        """
        T, nnz, K = metadata.num_tokens, metadata.num_kv_entries, self.topk_tokens
        if not isinstance(topk_indices, torch.Tensor) or topk_indices.dim() != 2 or \
                topk_indices.shape[0] < T or topk_indices.shape[1] != K:
            raise ValueError(f"topk_indices: expected [>= {T}, {K}] int32, got "
                             f"{list(topk_indices.shape) if isinstance(topk_indices, torch.Tensor) else topk_indices}")
        if topk_indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"topk_indices: expected int32 or int64, got {topk_indices.dtype}")
        if topk_indices.device != self.device:
            raise ValueError(f"topk_indices: expected a tensor on the builder's device {self.device}, got one on "
                             f"{topk_indices.device}")
        bt = self._device_ints("block_table", metadata.block_table, ndim=2)
        if validate is not None and not isinstance(validate, bool):
            raise TypeError(f"validate: expected a bool or None, got {type(validate).__name__} {validate!r}")
        if validate or (validate is None and topk_indices.device.type == "cpu"):
            self._validate_topk_indices(metadata, topk_indices[:T], bt.shape[1])
        if nnz == 0:
            return self.paged_kv_indices[:0]
        rows = topk_indices[:T].to(torch.int64)
        valid = rows >= 0
        order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices
        pos_c = rows.gather(1, order)
        count = valid.sum(dim=1)
        indptr = self.paged_kv_indptr[:T + 1].to(torch.int64)
        p = torch.arange(nnz, device=rows.device)
        owner = torch.searchsorted(indptr[1:], p, right=True)
        j = p - indptr[owner]
        pos = pos_c[owner, j].clamp(min=0)
        req = self.req_id_per_token[:T].to(torch.int64)[owner]
        bs = self.block_size
        slot = bt.to(torch.int64)[req, pos // bs] * bs + pos % bs
        hole = j >= count[owner]
        self.paged_kv_indices[:nnz] = torch.where(hole, torch.full_like(slot, -1), slot).to(torch.int32)
        return self.paged_kv_indices[:nnz]

    def _validate_topk_indices(self, metadata: SparseMLAMetadata, rows: torch.Tensor, num_blocks: int) -> None:
        """Host check of the top-k positions (see ``fill_global_indices``); one counted sync off the host."""
        ctx = metadata.context_positions
        if ctx is None or ctx.shape[0] != metadata.num_tokens:
            raise ValueError("metadata: expected the context_positions of its build() to validate topk_indices, got "
                             f"{None if ctx is None else list(ctx.shape)}")
        if rows.device.type != "cpu":
            self._host_sync("fill_global_indices: topk_indices validated on the host")
        host = rows.detach().to("cpu").numpy().astype(np.int64)
        bs = self.block_size

        def first(mask: np.ndarray) -> tuple[int, int, int]:
            t, c = (int(x) for x in np.argwhere(mask)[0])
            return t, c, int(host[t, c])

        bad = host < -1
        if bad.any():
            t, c, p = first(bad)
            raise ValueError(f"topk_indices: token {t}, column {c}: expected a position >= 0 or the hole marker -1, "
                             f"got {p}")
        valid = host >= 0
        beyond = valid & (host >= num_blocks * bs)
        if beyond.any():
            t, c, p = first(beyond)
            raise ValueError(f"topk_indices: token {t}, column {c}: expected a position inside the block table "
                             f"({num_blocks} blocks of {bs}: < {num_blocks * bs}), got {p}")
        past = valid & (host > ctx[:, None])
        if past.any():
            t, c, p = first(past)
            allowed = f"0..{int(ctx[t])}" if ctx[t] >= 0 else "none: the sequence is empty, only -1 holes"
            raise ValueError(f"topk_indices: token {t}, column {c}: expected a position in the token's context "
                             f"({allowed}), got {p}")
