"""Contracts of the DSv3.2 sparse metadata builder: ``cache-key-staleness`` and ``shrink-tail-extents``.

Both replay a case (a builder configuration and a list of scheduler steps, :class:`fuzz.sparse_metadata.MetadataCase`)
against the subject's builder (``sparse_metadata.SparseMLAMetadataBuilder``) and its partition consumer
(``work_partition.sparse_decode_from_partition``), and against the uncached oracle builder. :class:`MetadataReplay` is
also what the tests' RuleBasedStateMachine drives, step by step.

Violation messages carry no per-case numbers (those are in ``where``, ``expected`` and ``got``), so that a recorded
finding's signature matches every case it explains. A message about a token (its attention, its range of
``paged_kv_indices``) says so when the token's top-k row has ``-1`` holes within its sparse length, i.e. when its
valid entries are not the first ``sparse_len`` columns of the row.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import random

import torch
from hypothesis import strategies as st

from contracts.core import AMD_TARGETS, Violation, contract, fmt, record_margin, single_threaded
from contracts.subjects import bound
from fuzz import sparse_metadata as fsm
from fuzz.sparse_metadata import (MetadataCase, MetadataConfig, MetadataStep, burst_case, key_pair_case,
                                  key_weakening_case, metadata_case)
from impl.targets import Target, effective_cu_count
from oracles import sparse_metadata as oracle

HEAD_DIM = 576
KV_LORA_RANK = 512
#: deliberately not 1/sqrt(576), so a hard-coded scale is caught
SOFTMAX_SCALE = 0.0371
_SKIP = "the DSv3.2 ROCm AITER sparse builder runs on gfx942/gfx950 only"
#: appended to a message about a token whose top-k row has -1 holes within its sparse length
#: the sequence length of a padded request past R (a length no drawn request has)
PAD_SEQ_LEN = 77
HOLED_TOKEN = " at a token whose top-k row has -1 holes within its sparse length"


@contextlib.contextmanager
def fresh_memory_poisoned():
    """Allocate as PyTorch's deterministic mode does: ``torch.empty`` memory is filled (NaN for floats, the
    largest value for integers), so a buffer that relies on uninitialised memory being zero shows garbage."""
    was_on = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_on, warn_only=warn_only)


def _step_inputs(cfg: MetadataConfig, step: MetadataStep) -> dict:
    """Tensors of one step, made from the step's seed: block table, top-k rows, q, a poisoned kv cache."""
    g = torch.Generator().manual_seed(step.seed)
    rng = random.Random(step.seed)
    q_lens, seq_lens = list(step.q_lens), list(step.seq_lens)
    topk, bs = cfg.topk, cfg.block_size
    R, T = len(q_lens), sum(q_lens)
    blocks = [max(1, math.ceil(s / bs)) for s in seq_lens]
    width = max(blocks, default=1)
    num_blocks = sum(blocks) + 2
    perm = torch.randperm(num_blocks, generator=g).tolist()
    table = []
    used = 0
    for r in range(R):
        row = perm[used:used + blocks[r]]
        used += blocks[r]
        row += [perm[-1]] * (width - len(row))  # entries past a request's blocks are never read
        table.append(row)
    lens = oracle.sparse_lengths(q_lens, seq_lens, topk)
    rows = []
    t = 0
    for r in range(R):
        for off in range(q_lens[r]):
            n = lens[t]
            ctx = seq_lens[r] - q_lens[r] + off
            chosen = rng.sample(range(ctx + 1), n) if n else []
            if step.holes == "fewer" and n:
                chosen = chosen[:rng.randint(max(0, n - 2), n)]
            row = [-1] * topk
            if step.holes == "prefix":
                row[:len(chosen)] = chosen
            else:
                for col, p in zip(sorted(rng.sample(range(topk), len(chosen))), chosen):
                    row[col] = p
            rows.append(row)
            t += 1
    lists = oracle.kv_lists(q_lens, seq_lens, rows, table, bs, topk)
    slots = num_blocks * bs
    kv = torch.randn(slots, HEAD_DIM, generator=g).to(torch.bfloat16)
    referenced = torch.zeros(slots, dtype=torch.bool)
    for lst in lists:
        for s in lst:
            if s >= 0:
                referenced[s] = True
    kv[~referenced] = float("nan")  # a read of any slot no list holds shows up as NaN
    H = cfg.num_heads
    q = torch.randn(T, H, HEAD_DIM, generator=g).to(torch.bfloat16)
    return {"block_table": table, "topk_rows": rows, "lists": lists, "kv": kv, "q": q}


def _holed_tokens(cfg: MetadataConfig, step: MetadataStep, topk_rows: list[list[int]]) -> set[int]:
    """The tokens whose first ``sparse_len`` top-k columns hold a -1 (their valid entries are not a prefix)."""
    lens = oracle.sparse_lengths(list(step.q_lens), list(step.seq_lens), cfg.topk)
    return {t for t, (row, n) in enumerate(zip(topk_rows, lens)) if any(p < 0 for p in row[:n])}


def _common(step: MetadataStep, block_table: list[list[int]], common_cls=None):
    """The step's scheduler metadata as the subject's ``CommonMetadata`` (the current subject's, when not given)."""
    if common_cls is None:
        common_cls = bound(AMD_TARGETS[0]).sparse_metadata.CommonMetadata
    q_lens, seq_lens = list(step.q_lens), list(step.seq_lens)
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    table = [list(r) for r in block_table] or [[0]]  # no request: one row of the persistent table
    if step.pad:
        # a batch padded past R (as for a captured graph): the offsets repeat T, the padded requests have lengths
        # no real request has, and their table rows name a block of the pool; the builder reads the first R only
        starts += [starts[-1]] * step.pad
        seq_lens += [PAD_SEQ_LEN] * step.pad
        table += [table[-1]] * step.pad
    qsl = torch.tensor(starts, dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    lay = step.layout  # the same values in the memory of the step's layout (extras past the live entries: junk)
    return common_cls(
        query_start_loc=fsm.lay_out_ints(qsl, lay, 9999), query_start_loc_cpu=fsm.lay_out_ints(qsl, lay, 9999),
        seq_lens=fsm.lay_out_ints(seq, lay, 9999),
        seq_lens_cpu=fsm.lay_out_ints(seq, lay, 9999) if step.host_lens else None, num_reqs=len(q_lens),
        num_actual_tokens=starts[len(q_lens)], max_query_len=max(q_lens, default=0),
        block_table=fsm.lay_out_ints(torch.tensor(table, dtype=torch.int32), lay, table[-1][-1]))


class MetadataReplay:
    """One builder of the current subject fed step after step; each step is judged against the uncached oracle.

    The oracle's partition is computed with the CU count of the target and the kv granularity the builder partitions
    with (``builder.kv_granularity``: the configured one for ours; upstream passes 16 to AITER whatever is asked)."""

    def __init__(self, cfg: MetadataConfig, target: "Target | str"):
        from impl.targets import get_target

        self.cfg = cfg
        self.target = get_target(target)
        self.num_cu = effective_cu_count(self.target)
        self.sub = bound(self.target)
        family = self.sub.sparse_metadata
        self.common_cls = family.CommonMetadata
        with fresh_memory_poisoned():
            self.builder = family.SparseMLAMetadataBuilder(
                cfg.max_tokens, cfg.num_heads, topk_tokens=cfg.topk, block_size=cfg.block_size,
                target=self.target, kv_granularity=cfg.granularity, use_aiter=False)
        self.index = 0

    def step(self, step: MetadataStep, *, staleness: bool = True, extents: bool = True) -> list[Violation]:
        cfg, b = self.cfg, self.builder
        inp = _step_inputs(cfg, step)
        where = f"step {self.index} ({len(step.q_lens)} reqs, q_lens={list(step.q_lens)}, " \
                f"seq_lens={list(step.seq_lens)}, host_lens={step.host_lens}, holes={step.holes})"
        self.index += 1
        syncs_before = b.counters.host_syncs
        md = b.build(_common(step, inp["block_table"], self.common_cls))
        rows = torch.tensor(inp["topk_rows"], dtype=torch.int32).reshape(-1, cfg.topk)
        b.fill_global_indices(md, fsm.lay_out_ints(rows, step.layout, -1))
        holed = _holed_tokens(cfg, step, inp["topk_rows"])
        out_impl = None
        # a step with no token has no work: nothing consumes its partition (upstream skips the partition call and
        # hands none), so its partition buffers and its attention are not judged; the next step's are
        no_work = not sum(step.q_lens)
        if staleness and not no_work:
            T, H = md.num_tokens, cfg.num_heads
            Hp = md.num_heads
            q_pad = torch.zeros(T, Hp, HEAD_DIM, dtype=torch.bfloat16)
            q_pad[:, :H] = inp["q"]
            out = torch.full((T, Hp, KV_LORA_RANK), float("nan"), dtype=torch.bfloat16)
            consume = self.sub.work_partition.sparse_decode_from_partition
            out_impl = consume(q_pad, inp["kv"], b.paged_kv_indices, b.partition, SOFTMAX_SCALE, KV_LORA_RANK,
                               out=out)[:, :H].clone()
        fresh = oracle.fresh_buffers(
            max_tokens=cfg.max_tokens, topk=cfg.topk, block_size=cfg.block_size, num_cu=self.num_cu,
            granularity=int(b.kv_granularity), q_lens=list(step.q_lens), seq_lens=list(step.seq_lens),
            topk_rows=inp["topk_rows"], block_table=inp["block_table"])
        v: list[Violation] = []
        if staleness and not no_work:
            v += self._check_staleness(md, fresh, inp, out_impl, where, step, b.counters.host_syncs - syncs_before,
                                       holed)
        if extents:
            v += self._check_extents(fresh, where, holed, partition=not no_work)
            v += self._check_views(md, fresh, where, step)
        return v

    #: the per-token views the built metadata hands its consumers, and how many entries each must hold (T tokens)
    VIEWS = {"req_id_per_token": lambda T, k: T, "qo_indptr": lambda T, k: T + 1,
             "paged_kv_last_page_len": lambda T, k: T, "paged_kv_indptr": lambda T, k: T + 1,
             "paged_kv_indices": None}  # its live region ends at paged_kv_indptr[T] (past it: the extents check)

    def _check_views(self, md, fresh, where, step) -> list[Violation]:
        """Each per-token view of the returned metadata holds at least its live region (a consumer reads
        ``qo_indptr[T]`` and ``paged_kv_indptr[T]``), equal there to the builder's buffer (which the extents check
        judges against a fresh full build, so a wrong buffer is said once, there); longer views (the whole buffer)
        are fine. A subject whose metadata has no such attribute is not judged on it."""
        v: list[Violation] = []
        T = sum(step.q_lens)
        buffers = self.builder.buffers()
        for name, need in self.VIEWS.items():
            view = getattr(md, name, None)
            if not isinstance(view, torch.Tensor):
                continue
            n = need(T, self.cfg.topk) if need is not None else int(fresh["_live_ends"][name])
            got = view.reshape(-1).to(torch.int64).cpu()
            if got.numel() < n:
                v.append(Violation(f"metadata.{name}: shorter than its live region", where,
                                   f"at least {n} entries", f"{got.numel()}"))
                continue
            if name not in buffers:
                continue
            exp = buffers[name].reshape(-1).to(torch.int64).cpu()[:n]
            bad = (got[:n] != exp).nonzero()
            if len(bad):
                i = int(bad[0, 0])
                v.append(Violation(f"metadata.{name}: the view differs from the builder's own buffer", f"{where}: "
                                   f"{name}[{i}]", fmt(exp[i].tolist()), fmt(got[i].tolist())))
        return v

    def _check_staleness(self, md, fresh, inp, out_impl, where, step, syncs, holed=frozenset()) -> list[Violation]:
        v: list[Violation] = []
        kind = "cache hit" if md.cache_hit else "recompute"
        for name, buf in self.builder.partition.items():
            exp = fresh[f"partition.{name}"]
            got = buf.to(torch.int64)
            if not torch.equal(got, exp):
                bad = (got != exp).nonzero()[0].tolist()
                v.append(Violation(f"work partition ({kind}) differs from a fresh computation",
                                   f"{where}: partition.{name}{bad}", fmt(exp[tuple(bad)].item()),
                                   fmt(got[tuple(bad)].item())))
                break
        if not step.host_lens and syncs < 1:
            v.append(Violation("seq_lens_cpu missing but the builder neither copied the lengths to the host nor "
                               "recomputed", where, ">= 1 host sync", str(syncs)))
        ref, nat, dot_scale = oracle.sparse_decode_reference(inp["q"], inp["kv"], inp["lists"], SOFTMAX_SCALE,
                                                             KV_LORA_RANK)
        got = out_impl.to(torch.float64)
        nan_got = torch.isnan(got)
        tol = oracle.attention_tolerance(nat, dot_scale, ref, HEAD_DIM, self.cfg.topk)
        err = (got - ref).abs()
        if not nan_got.any():
            record_margin(err, tol)
        out_of_bound = err > tol
        ratio = torch.where(out_of_bound, err / tol, torch.zeros_like(err))
        cos = float(torch.nn.functional.cosine_similarity(torch.nan_to_num(got).flatten(), ref.flatten(), dim=0))
        holed_rows = torch.zeros(got.shape[0], dtype=torch.bool)
        holed_rows[sorted(t for t in holed if t < got.shape[0])] = True
        # tokens whose rows hold their valid entries first, then the others: each class names its own first lane
        for rows, suffix in ((~holed_rows, ""), (holed_rows, HOLED_TOKEN)):
            sel = rows[:, None, None].expand_as(got)
            nan_here = nan_got & sel
            if nan_here.any():
                idx = nan_here.nonzero()[0].tolist()
                v.append(Violation(f"attention output ({kind}) has NaN (a slot outside the token's list was read, "
                                   "or no work item covered it)" + suffix, f"{where}: out{idx}", "finite", "nan"))
                continue
            oob = out_of_bound & sel
            if oob.any():
                r = torch.where(sel, ratio, torch.zeros_like(ratio))
                idx = [int(i) for i in torch.unravel_index(r.argmax(), r.shape)]
                v.append(Violation(f"attention from the {kind} partition differs from the oracle beyond the derived "
                                   "bound" + suffix, f"{where}: out{idx}",
                                   f"{ref[tuple(idx)].item():.6g} +- {tol[tuple(idx)].item():.3g}",
                                   f"{got[tuple(idx)].item():.6g} ({int(oob.sum())} of {int(sel.sum())} lanes beyond "
                                   f"the bound, cosine {cos:.6f}, worst lane at {ratio[tuple(idx)].item():.3g}x the "
                                   "bound)"))
        return v

    def _check_extents(self, fresh, where, holed=frozenset(), partition: bool = True) -> list[Violation]:
        """Per buffer: the first difference in the live region and the first past the extent. In
        ``paged_kv_indices``' live region, the first difference in a range of a token whose row has holes and the
        first in any other token's range are each named. ``partition`` False: the work partition's buffers are
        not judged (a step with no token)."""
        v: list[Violation] = []
        live_ends = fresh["_live_ends"]
        for name, buf in self.builder.buffers().items():
            if not partition and name.startswith("partition."):
                continue
            exp = fresh[name]
            got = buf.to(torch.int64)
            if tuple(got.shape) != tuple(exp.shape):
                v.append(Violation(f"{name}: buffer shape", where, str(list(exp.shape)), str(list(got.shape))))
                continue
            diff = (got != exp)
            if diff.dim() > 1:
                diff = diff.any(dim=tuple(range(1, diff.dim())))
            if not diff.any():
                continue
            end = live_ends.get(name)
            end = diff.shape[0] if end is None else int(end)
            pos = torch.arange(diff.shape[0])
            live, past = diff & (pos < end), diff & (pos >= end)
            found = f"{name}: live region differs from a fresh full build"
            classes = [(live, found), (past, f"{name}: past the extent (must be zero) differs from a fresh full build")]
            if name == "paged_kv_indices" and holed:
                indptr = fresh["paged_kv_indptr"]
                owner = torch.searchsorted(indptr[1:], pos.to(indptr.dtype), right=True)
                in_holed = torch.isin(owner, torch.tensor(sorted(holed), dtype=owner.dtype))
                classes = [(live & ~in_holed, found), (live & in_holed, found + HOLED_TOKEN), classes[1]]
            for mask, msg in classes:
                if mask.any():
                    i = int(mask.nonzero()[0, 0])
                    v.append(Violation(msg, f"{where}: {name}[{i}]", fmt(exp[i].tolist()), fmt(got[i].tolist())))
        return v


LAYOUT_READ_PACKED = ("a non-packed layout of the step's metadata is read as if packed: the step fails where the "
                      "same values packed pass")


def _replay(case: MetadataCase, target: Target, *, staleness: bool, extents: bool) -> list[Violation]:
    """Every step judged, also after one that failed: a later step's own violation is not hidden behind an earlier
    one (a known finding in step 0 must not mask a new one in step 2). A case with non-packed steps
    (``MetadataStep.layout``) runs a second builder in lockstep on the same values packed: the twin's verdict judges
    the values, and a step whose verdict in its given layout (or after an earlier step's) has any other violation
    adds one violation saying so."""
    laid = any(s.layout != "contiguous" for s in case.steps)
    with single_threaded():
        replay = MetadataReplay(case.config, target)
        twin = MetadataReplay(case.config, target) if laid else None
        v: list[Violation] = []
        for i, step in enumerate(case.steps):
            got = replay.step(step, staleness=staleness, extents=extents)
            if twin is None:
                v += got
                continue
            packed = twin.step(dataclasses.replace(step, layout="contiguous"), staleness=staleness, extents=extents)
            laid_so_far = [s.layout for s in case.steps[:i + 1] if s.layout != "contiguous"]
            extra = [x for x in got if (x.message, x.where) not in {(p.message, p.where) for p in packed}]
            if extra and laid_so_far:  # this step's layout, or an earlier one's state, is the cause
                got = packed + [Violation(LAYOUT_READ_PACKED, f"step {i} (layouts so far {laid_so_far}): "
                                          f"{extra[0].where}", extra[0].expected,
                                          f"{extra[0].message}: {extra[0].got}"[:200])]
            v += got
    return v


def _cfg(**kw) -> MetadataConfig:
    return MetadataConfig(**{**dict(seed=0, topk=8, granularity=4, block_size=1, max_tokens=16, num_heads=2), **kw})


def _st(q, s, host=True, holes="prefix", seed=1, pad=0) -> MetadataStep:
    return MetadataStep(q_lens=tuple(q), seq_lens=tuple(s), host_lens=host, holes=holes, seed=seed, pad=pad)


def _case(*steps: MetadataStep) -> MetadataCase:
    return MetadataCase(config=_cfg(), steps=steps)


def _staleness_examples(target: Target) -> list[MetadataCase]:
    return [
        # upstream's key collides: same (T, max_query_len, H, min(seq_lens, topk)), query lengths swapped.
        _case(_st([1, 3], [5, 5]), _st([3, 1], [5, 5], seed=2)),
        # one request whose prefill chunk crosses topk: clamped lengths equal (8), sparse lengths differ.
        _case(_st([4], [9]), _st([4], [12], seed=2)),
        # seq_lens_cpu missing in steady decode below topk.
        _case(_st([1, 1], [3, 4], host=False), _st([1, 1], [4, 5], host=False, seed=2)),
        # the last request's query length changes, the request starts do not.
        _case(_st([2, 1], [5, 5]), _st([2, 2], [5, 5], seed=2)),
        # the same T, max_query_len, min(seq_lens, topk) and min(seq_lens - q_lens, topk), the query lengths of the
        # two requests swapped with their lengths: sparse lengths [7, 8, 8, 8, 7, 8] then [7, 8, 7, 8, 8, 8].
        _case(_st([4, 2], [10, 8]), _st([2, 4], [8, 10], seed=2)),
        # -1 holes anywhere in the rows.
        _case(_st([2, 1], [6, 7], holes="anywhere")),
        # a batch padded past R (offsets, lengths and table rows), then the same step unpadded: a hit.
        _case(_st([2, 1], [6, 9], pad=2), _st([2, 1], [6, 9], host=False, seed=2)),
        # a batch that drains to no request at all (num_reqs 0, no token, max_query_len 0: the builder accepts it;
        # a step with no token has no partition to judge), then the first batch again: a hit or a fresh partition
        _case(_st([2, 2, 1], [6, 9, 3]), _st([], [], seed=2), _st([2, 2, 1], [6, 9, 3], seed=3)),
    ]


def _extents_examples(target: Target) -> list[MetadataCase]:
    return [
        # a batch that shrinks: everything past the new extents must be zero again.
        _case(_st([2, 2, 1], [6, 9, 3]), _st([1], [7], seed=2)),
        # FINDINGS M2: upstream's T * topk extent leaves ids 1 and 2 of the first step in place.
        _case(_st([2], [2]), _st([1], [1], seed=2)),
    ]


@contract("cache-key-staleness", targets=AMD_TARGETS,
          cases=lambda target: st.one_of(key_weakening_case(), metadata_case(), key_pair_case(), burst_case()),
          examples=_staleness_examples, skip_reason=_SKIP, case_type=MetadataCase, numeric=True)
def cache_key_staleness(case: MetadataCase, target: Target) -> list[Violation]:
    """Whenever the sparse metadata builder reuses its cached work partition, the partition equals a fresh
    computation, and the attention a consumer computes by executing it equals the oracle's (float64, over the
    oracle's own kv lists, within a derived fp32/bf16 bound). With ``seq_lens_cpu`` missing the builder never serves a
    stale partition and never fails silently (it copies the lengths to the host, a counted sync). A quarter of the
    generated cases probe every weakening of the key by construction (``fuzz.sparse_metadata.key_weakening_case``:
    each separable component dropped, the clamp tightened by one, consecutive steps equal under the weakened key with
    different sparse lengths). Seed 000 (the cache key and its unresolved review comment); SPEC section 6."""
    return _replay(case, target, staleness=True, extents=False)


@contract("shrink-tail-extents", targets=AMD_TARGETS, cases=lambda target: metadata_case(),
          examples=_extents_examples, skip_reason=_SKIP, case_type=MetadataCase, numeric=False)
def shrink_tail_extents(case: MetadataCase, target: Target) -> list[Violation]:
    """After every step each persistent buffer of the sparse metadata builder equals, over its whole length, what a
    fresh full build writes: the live region exactly, and everything past the current extent zero, including memory
    no step ever wrote (fresh allocations are poisoned the way PyTorch's deterministic mode fills ``torch.empty``).
    The builder's design leaves no gap between the two (impl/sparse_metadata.py documents the extents). Seed 000
    (shrink-tail zeroing; the review comment on ``torch.empty``); SPEC section 6."""
    return _replay(case, target, staleness=False, extents=True)
