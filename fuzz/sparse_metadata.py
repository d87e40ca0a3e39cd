"""Case types and strategies for the sparse metadata builder: a builder configuration and sequences of scheduler steps.

A case (:class:`MetadataCase`) is a :class:`MetadataConfig` and a tuple of concrete :class:`MetadataStep`. Steps are
produced from the previous one by *ops* (:class:`MetadataOp`, all randomness inside), through the deterministic
:func:`apply_op`; the contract's case generator and the RuleBasedStateMachine in the tests draw the same ops and use
the same function. The ops aim at the states where cached metadata goes stale: steady decode (hits), lengths crossing
``topk``, the same clamped lengths with a different query-length distribution, the last request's query length
changed (same starts), batches growing and shrinking, empty sequences, and ``seq_lens_cpu`` missing.
:func:`key_weakening_case` probes every weakening of the cache key by construction (see "key weakenings" below).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from hypothesis import strategies as st

from fuzz.cases import Case

MAX_TOKENS = 16
MAX_Q = 4
HOLE_MODES = ("prefix", "anywhere", "fewer")

HoleMode = Literal["prefix", "anywhere", "fewer"]
OpKind = Literal["fresh", "decode", "repeat", "permute_q", "retime_last", "shrink", "grow", "cross_topk"]
#: a request's sequence length as an op names it: "empty" (0), "topk-2".."topk+3" (relative to the config's topk),
#: or an absolute length (raised to the request's query length)
SeqCode = int | str


@dataclass(frozen=True)
class MetadataConfig(Case):
    """How the builder is constructed: top-k width, kv granularity, block size, token capacity, heads; ``seed`` is
    part of the drawn configuration (the steps carry their own)."""

    KIND: ClassVar[str] = "sparse-metadata-config"

    seed: int
    topk: int
    granularity: int
    block_size: int
    num_heads: int
    max_tokens: int = MAX_TOKENS

    def __post_init__(self):
        super().__post_init__()
        bad = [n for n in ("topk", "granularity", "block_size", "num_heads", "max_tokens") if getattr(self, n) < 1]
        if bad:
            raise ValueError(f"{', '.join(bad)}: must be >= 1")


@dataclass(frozen=True)
class MetadataStep(Case):
    """One scheduler step: per-request query and sequence lengths, whether ``seq_lens_cpu`` is passed, where the -1
    holes of the top-k rows go, and the seed its tensors are made from."""

    KIND: ClassVar[str] = "sparse-metadata-step"
    ADDED_FIELDS = ('layout',)

    q_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    host_lens: bool = True
    holes: HoleMode = "prefix"
    seed: int = 0
    #: entries past the R requests in query_start_loc, seq_lens (and seq_lens_cpu) and the block table, as a
    #: scheduler that pads its batch gives them; the builder must read the first R only
    pad: int = 0
    #: the memory of the step's tensors (the same values): :data:`META_LAYOUTS`
    layout: Literal["contiguous", "persistent-slice", "strided"] = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.pad < 0:
            raise ValueError("pad: must be >= 0")
        # no request at all is a step too (num_reqs 0: the builder accepts it); generated steps keep at least one
        if len(self.seq_lens) != len(self.q_lens):
            raise ValueError("q_lens and seq_lens need one entry per request")
        bad = [r for r, (q, s) in enumerate(zip(self.q_lens, self.seq_lens)) if q < 1 or not (s == 0 or s >= q)]
        if bad:
            raise ValueError(f"requests {bad}: need q_len >= 1 and seq_len 0 or >= q_len")


@dataclass(frozen=True)
class MetadataCase(Case):
    """A builder configuration and the steps fed to one builder, in order."""

    KIND: ClassVar[str] = "sparse-metadata"

    config: MetadataConfig
    steps: tuple[MetadataStep, ...]

    def __post_init__(self):
        super().__post_init__()
        if not self.steps:
            raise ValueError("steps: at least one step")
        over = [i for i, s in enumerate(self.steps) if sum(s.q_lens) > self.config.max_tokens]
        if over:
            raise ValueError(f"steps {over}: more tokens than config.max_tokens={self.config.max_tokens}")


@dataclass(frozen=True)
class MetadataOp(Case):
    """What makes the next step from the previous one (see :func:`apply_op`); the fields an op kind does not read
    keep their defaults."""

    KIND: ClassVar[str] = "sparse-metadata-op"

    op: OpKind
    host_lens: bool
    holes: HoleMode
    seed: int
    #: fresh / grow: (q_len, sequence-length code) per new request
    reqs: tuple[tuple[int, SeqCode], ...] = ()
    perm_seed: int = 0  # permute_q
    q: int = 1  # retime_last
    keep: int = 1  # shrink
    delta: int = 0  # cross_topk


def config_strategy() -> st.SearchStrategy:
    return st.builds(
        MetadataConfig,
        seed=st.integers(0, 2**31 - 1),
        topk=st.sampled_from([24, 4, 7, 40]),
        granularity=st.sampled_from([8, 16]),
        block_size=st.sampled_from([1, 3]),
        max_tokens=st.just(MAX_TOKENS),
        num_heads=st.sampled_from([2, 16, 17]),
    )


def _common() -> dict:
    return {"host_lens": st.booleans(), "holes": st.sampled_from(HOLE_MODES), "seed": st.integers(0, 2**31 - 1)}


_seq_code = st.one_of(st.just("empty"), st.integers(-2, 3).map(lambda d: f"topk{d:+d}"), st.integers(1, 48))
_req = st.tuples(st.integers(1, MAX_Q), _seq_code)
_reqs = lambda lo, hi: st.lists(_req, min_size=lo, max_size=hi).map(tuple)  # noqa: E731

OP_STRATEGIES: dict[str, st.SearchStrategy] = {
    "fresh": st.builds(MetadataOp, op=st.just("fresh"), reqs=_reqs(2, 5), **_common()),
    "decode": st.builds(MetadataOp, op=st.just("decode"), **_common()),
    "repeat": st.builds(MetadataOp, op=st.just("repeat"), **_common()),
    "permute_q": st.builds(MetadataOp, op=st.just("permute_q"), perm_seed=st.integers(0, 1000), **_common()),
    "retime_last": st.builds(MetadataOp, op=st.just("retime_last"), q=st.integers(1, MAX_Q), **_common()),
    "shrink": st.builds(MetadataOp, op=st.just("shrink"), keep=st.integers(1, 4), **_common()),
    "grow": st.builds(MetadataOp, op=st.just("grow"), reqs=_reqs(1, 3), **_common()),
    "cross_topk": st.builds(MetadataOp, op=st.just("cross_topk"), delta=st.integers(-2, 3), **_common()),
}


def op_strategy() -> st.SearchStrategy:
    return st.one_of(*OP_STRATEGIES.values())


def pad_for(seed: int) -> int:
    """How many padded requests a drawn step carries past R: 2 for one step in five, chosen by its seed (so the
    draws themselves are unchanged)."""
    return 2 if seed % 5 == 0 else 0


def _seq_from_code(code: SeqCode, q: int, topk: int) -> int:
    if code == "empty":
        return 0
    if isinstance(code, str) and code.startswith("topk"):
        s = topk + int(code[4:])
    else:
        s = int(code)
    return max(s, q)


def _fix(q_lens: list[int], seq_lens: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """Keep a step valid: seq_len 0 or >= q_len, at least one request, at most ``max_tokens`` tokens."""
    seq_lens = [0 if s == 0 else max(s, q) for q, s in zip(q_lens, seq_lens)]
    while len(q_lens) > 1 and sum(q_lens) > max_tokens:
        q_lens, seq_lens = q_lens[:-1], seq_lens[:-1]
    if not q_lens:
        q_lens, seq_lens = [1], [1]
    return q_lens, seq_lens


#: the requests a first step gets when its op is not ``fresh`` and names none
_FIRST_REQS: tuple[tuple[int, SeqCode], ...] = ((1, 5), (2, "topk+0"))

def layout_for(seed: int) -> str:
    """The memory layout of a drawn step's tensors: a persistent-buffer slice or strided for one step in seven
    each, chosen by its seed (as :func:`pad_for`)."""
    return {1: "persistent-slice", 2: "strided"}.get(seed % 7, "contiguous")


def apply_op(prev: MetadataStep | None, op: MetadataOp, cfg: MetadataConfig) -> MetadataStep:
    """The concrete step ``op`` makes from ``prev`` (None: the first step; any op then acts as ``fresh``)."""
    topk, max_tokens = cfg.topk, cfg.max_tokens
    kind = op.op
    reqs = op.reqs
    if prev is None and kind != "fresh":
        kind = "fresh"
        reqs = reqs or _FIRST_REQS
    if kind == "fresh":
        q = [r[0] for r in reqs]
        s = [_seq_from_code(r[1], r[0], topk) for r in reqs]
    else:
        q, s = list(prev.q_lens), list(prev.seq_lens)
        if kind == "decode":
            s = [0 if x == 0 else x + 1 for x in s]
            q = [1] * len(q)
        elif kind == "permute_q":
            rng = random.Random(op.perm_seed)
            rng.shuffle(q)
        elif kind == "retime_last":
            # Same request starts; max_query_len kept when another request sets it (the key's other fields).
            cap = MAX_Q if len(q) == 1 else max(q[:-1])
            shift = 1 + (op.q - 1) % (cap - 1) if cap > 1 else 0  # always a different length when possible
            new_q = 1 + (q[-1] - 1 + shift) % cap
            q[-1] = new_q if s[-1] == 0 else min(new_q, s[-1])
        elif kind == "shrink":
            q, s = q[:op.keep], s[:op.keep]
        elif kind == "grow":
            q = q + [r[0] for r in reqs]
            s = s + [_seq_from_code(r[1], r[0], topk) for r in reqs]
        elif kind == "cross_topk":
            s = [0 if x == 0 else topk + op.delta + (qq - 1) for x, qq in zip(s, q)]
    q, s = _fix(q, s, max_tokens)
    return MetadataStep(q_lens=tuple(q), seq_lens=tuple(s), host_lens=op.host_lens, holes=op.holes, seed=op.seed,
                        pad=pad_for(op.seed), layout=layout_for(op.seed))


@st.composite
def metadata_case(draw, min_steps: int = 2, max_steps: int = 6) -> MetadataCase:
    """A builder configuration and a sequence of concrete steps."""
    cfg = draw(config_strategy())
    n = draw(st.integers(min_steps, max_steps))
    steps: list[MetadataStep] = []
    prev = None
    for _ in range(n):
        prev = apply_op(prev, draw(op_strategy()), cfg)
        steps.append(prev)
    return MetadataCase(config=cfg, steps=tuple(steps))


@st.composite
def burst_case(draw) -> MetadataCase:
    """A case of :func:`metadata_case`'s shape whose ops come in bursts: one op kind repeated 1..3 times (each
    repetition draws its own ``host_lens``, holes and seed). Ops drawn one by one rarely repeat, yet runs of the same
    op are where a cached partition is served: steady decode, decode with ``seq_lens_cpu`` missing on consecutive
    steps, repeated re-timing of the last request."""
    cfg = draw(config_strategy())
    steps: list[MetadataStep] = []
    prev = None
    kinds = sorted(OP_STRATEGIES)
    while len(steps) < 2 or (len(steps) < 6 and draw(st.booleans())):
        kind = draw(st.sampled_from(kinds))
        for _ in range(draw(st.integers(1, 3))):
            prev = apply_op(prev, draw(OP_STRATEGIES[kind]), cfg)
            steps.append(prev)
    return MetadataCase(config=cfg, steps=tuple(steps))


#: the ops that keep every input of a weaker cache key but one: the order of the query lengths (permute_q), the last
#: request's query length with the starts unchanged (retime_last), lengths moved across topk (cross_topk), a
#: decode step after a decode step (same query lengths, every length one longer); each one is a distinct input a
#: correct key must see
KEY_PROBE_OPS = ("permute_q", "retime_last", "cross_topk", "decode")


@st.composite
def key_pair_case(draw) -> MetadataCase:
    """A multi-request step followed by a step that differs from it in one input a cache key must include (one of
    :data:`KEY_PROBE_OPS`), then possibly a repeat, which a stale cache serves again. The first step's requests have
    distinct query lengths and sequence lengths around topk, where the clamped lengths and the partition move.
    Sequences of random ops reach such a pair only by luck; each key field dropped from the key needs exactly this
    pair to show, with ``seq_lens_cpu`` present or missing on the probing step."""
    cfg = draw(config_strategy())
    kind = draw(st.sampled_from(KEY_PROBE_OPS))
    n = draw(st.integers(2, 4))
    qs = draw(st.permutations(range(1, MAX_Q + 1)))[:n]
    if kind == "retime_last":  # another request sets max_query_len, so re-timing the last one keeps it
        qs = sorted(qs, reverse=True)
    codes = draw(st.lists(st.integers(-2, 3).map(lambda d: f"topk{d:+d}"), min_size=n, max_size=n))
    common = dict(host_lens=True, holes=draw(st.sampled_from(HOLE_MODES)), seed=draw(st.integers(0, 2**31 - 1)))
    first = apply_op(None, MetadataOp(op="fresh", reqs=tuple(zip(qs, codes)), **common), cfg)
    steps = [first]
    if kind == "decode":  # decode after decode: the query lengths stay 1, only the lengths move
        steps.append(apply_op(first, MetadataOp(op="decode", **common), cfg))
    probe = draw(OP_STRATEGIES[kind])
    steps.append(apply_op(steps[-1], probe, cfg))
    if draw(st.booleans()):
        steps.append(apply_op(steps[-1], draw(OP_STRATEGIES["repeat"]), cfg))
    return MetadataCase(config=cfg, steps=tuple(steps))


# --- key weakenings -------------------------------------------------------------------------------------------------
#
# The builder's cache key (impl/sparse_metadata.py; FINDINGS.md M1) is
# ``(T, max_query_len, H, bytes(request starts), bytes(min(seq_len, topk + q_len - 1)))``. A weakening drops one
# component or tightens the clamp by one. For each weakening that can collide, :func:`key_weakening_case` puts two
# consecutive steps into the case that are equal under the weakened key but have different per-token sparse lengths
# (hence a different ``paged_kv_indptr``, work partition and attention): a builder keyed on the weakened key serves
# the first step's partition to the second, and the contract sees it by construction, not by the draw's luck.
#
# Two components cannot be separated within one builder, so dropping them is an equivalent change, never probed:
# ``max_query_len`` is the largest difference of the starts with ``T`` appended, and ``H`` (the padded head count) is
# a constant of the builder.

#: every component of the key, in order
KEY_COMPONENTS = ("num_tokens", "max_query_len", "num_heads", "starts", "clamped")
#: components whose removal no pair of steps of one builder can show, with why
KEY_EQUIVALENT_DROPS = {
    "max_query_len": "implied by the request starts and num_tokens",
    "num_heads": "a constant of the builder",
}
#: the weakenings :func:`key_weakening_case` probes: a component dropped, or ``clamp-1`` (``min(seq_len, topk + q_len
#: - 2)``); ``clamped-hostless`` drops the lengths on steps without ``seq_lens_cpu`` only, so both steps of its pair
#: come without them
KEY_WEAKENINGS = ("drop:num_tokens", "drop:starts", "drop:clamped", "clamped-hostless", "clamp-1")


def _starts(q_lens) -> tuple[int, ...]:
    out = [0]
    for q in q_lens:
        out.append(out[-1] + q)
    return tuple(out)


def step_key(step: MetadataStep, cfg: MetadataConfig, weakening: str | None = None) -> tuple:
    """The builder's cache key of ``step`` as the design states it (``weakening`` None), or under one weakening
    (a name of :data:`KEY_WEAKENINGS` or ``drop:<component>`` of :data:`KEY_COMPONENTS`). The padded head count is
    the configured one (a constant of the builder, so its padding does not matter here)."""
    starts = _starts(step.q_lens)
    tighten = 1 if weakening == "clamp-1" else 0
    clamped = tuple(min(s, cfg.topk + q - 1 - tighten) for q, s in zip(step.q_lens, step.seq_lens))
    if weakening == "clamped-hostless" and not step.host_lens:
        clamped = (0,) * len(clamped)
    key = {"num_tokens": starts[-1], "max_query_len": max(step.q_lens), "num_heads": cfg.num_heads,
           "starts": starts[:-1], "clamped": clamped}
    if weakening is not None and weakening.startswith("drop:"):
        comp = weakening[5:]
        if comp not in key:
            raise ValueError(f"weakening {weakening!r}: no key component {comp!r}; known: {', '.join(KEY_COMPONENTS)}")
        del key[comp]
    elif weakening not in (None, "clamp-1", "clamped-hostless"):
        raise ValueError(f"unknown weakening {weakening!r}")
    return tuple(key.items())


def step_sparse_lengths(step: MetadataStep, topk: int) -> tuple[int, ...]:
    """Per token ``min(seq_len - q_len + offset + 1, topk)`` (0 for an empty sequence): what the partition is a
    function of (SPEC section 6)."""
    out = []
    for q, s in zip(step.q_lens, step.seq_lens):
        out += [0 if s == 0 else min(s - q + off + 1, topk) for off in range(q)]
    return tuple(out)


def _with(prev: MetadataStep, q, s, rng: random.Random, host: bool | None = None) -> MetadataStep:
    seed = rng.randrange(2**31)
    return MetadataStep(q_lens=tuple(q), seq_lens=tuple(s), host_lens=prev.host_lens if host is None else host,
                        holes=rng.choice(HOLE_MODES), seed=seed, pad=pad_for(seed))


def _collide(prev: MetadataStep, weakening: str, cfg: MetadataConfig, rng: random.Random) -> MetadataStep | None:
    """A step equal to ``prev`` under ``weakening`` with different sparse lengths, or None when ``prev`` has none."""
    topk = cfg.topk
    q, s = list(prev.q_lens), list(prev.seq_lens)
    cands: list[tuple[list[int], list[int]]] = []
    if weakening == "drop:num_tokens":
        # the last request's query length changes; starts, max_query_len and every clamped length stay
        if len(q) >= 2:
            m = max(q[:-1])
            for new in range(1, m + 1):
                if new == q[-1] or q[-1] > m or sum(q) - q[-1] + new > cfg.max_tokens:
                    continue
                c = min(s[-1], topk + q[-1] - 1)
                ns = c if c == 0 or c < topk + new - 1 else None
                if ns is not None and (ns == 0 or ns >= new):
                    cands.append((q[:-1] + [new], s[:-1] + [ns]))
    elif weakening == "drop:starts":
        # the query lengths permuted (T and max_query_len stay), each request's clamped length kept
        for _ in range(12):
            perm = q[:]
            rng.shuffle(perm)
            if perm == q:
                continue
            ns = []
            for qo, so, qn in zip(q, s, perm):
                c = min(so, topk + qo - 1)
                if c == 0 or (c < topk + qn - 1 and c >= qn):
                    ns.append(c)
                elif c == topk + qn - 1:
                    ns.append(c + rng.randint(0, 2))
                else:
                    break
            else:
                cands.append((perm, ns))
    elif weakening in ("drop:clamped", "clamped-hostless"):
        # one request's length moves so that its clamped length changes; near the clamp where possible
        for r in range(len(q)):
            lim = topk + q[r] - 1
            for ns in {s[r] + 1, s[r] - 1, lim, lim - 1, lim + 1, q[r], 0}:
                if (ns == 0 or ns >= q[r]) and min(ns, lim) != min(s[r], lim):
                    cands.append((q, s[:r] + [ns] + s[r + 1:]))
    elif weakening == "clamp-1":
        # a length at or past the clamp against one just below it: min(seq, topk + q - 2) is the same for both
        for r in range(len(q)):
            lim = topk + q[r] - 1
            if s[r] >= lim:
                cands.append((q, s[:r] + [lim - 1] + s[r + 1:]))
            elif s[r] == lim - 1:
                cands.append((q, s[:r] + [lim + rng.randint(0, 2)] + s[r + 1:]))
    else:
        raise ValueError(f"unknown weakening {weakening!r}")
    rng.shuffle(cands)
    for nq, ns in cands:
        nxt = _with(prev, nq, ns, rng)
        if step_key(nxt, cfg, weakening) == step_key(prev, cfg, weakening) and \
                step_sparse_lengths(nxt, topk) != step_sparse_lengths(prev, topk):
            return nxt
    return None


def _setup(prev: MetadataStep, weakening: str, cfg: MetadataConfig, rng: random.Random) -> MetadataStep:
    """A step from which ``weakening`` has a colliding successor: distinct query lengths, the largest not last,
    lengths at most ``topk`` (so the clamps leave room), and for ``clamp-1`` one request at its clamp; for
    ``clamped-hostless`` without ``seq_lens_cpu``."""
    n = rng.randint(2, 4)
    q = rng.sample(range(1, MAX_Q + 1), n)
    if q.index(max(q)) == n - 1:
        q[0], q[-1] = q[-1], q[0]
    s = [rng.randint(MAX_Q, cfg.topk) if cfg.topk >= MAX_Q else MAX_Q for _ in q]
    if weakening == "clamp-1":
        r = rng.randrange(n)
        s[r] = cfg.topk + q[r] - 1 + rng.randint(0, 1)
    host = False if weakening == "clamped-hostless" else rng.random() < 0.75
    return _with(prev, q, s, rng, host=host)


@st.composite
def key_weakening_case(draw) -> MetadataCase:
    """Steps that probe every weakening of :data:`KEY_WEAKENINGS`, in a drawn order: for each, a step and its
    successor equal under the weakened key but with different sparse lengths (:func:`step_key`,
    :func:`step_sparse_lengths`). Where the previous step has no such successor a setup step comes first. A
    builder whose key lost a component, or whose clamp is one tighter, serves a stale partition in this case,
    whatever else was drawn."""
    cfg = draw(config_strategy())
    order = draw(st.permutations(KEY_WEAKENINGS))
    rng = random.Random(draw(st.integers(0, 2**31 - 1)))
    steps: list[MetadataStep] = []
    prev: MetadataStep | None = None
    for w in order:
        nxt = None
        if prev is not None and (w != "clamped-hostless" or not prev.host_lens):
            nxt = _collide(prev, w, cfg, rng)
        if nxt is None:
            prev = _setup(prev or MetadataStep(q_lens=(1,), seq_lens=(1,)), w, cfg, rng)
            steps.append(prev)
            nxt = _collide(prev, w, cfg, rng)
            if nxt is None:  # pragma: no cover - _setup's steps always have one (tests/test_key_weakening.py)
                raise AssertionError(f"no colliding successor for {w} from {prev}")
        if w == "clamped-hostless":
            nxt = MetadataStep(q_lens=nxt.q_lens, seq_lens=nxt.seq_lens, host_lens=False, holes=nxt.holes,
                               seed=nxt.seed, pad=nxt.pad)
        steps.append(nxt)
        prev = nxt
    return MetadataCase(config=cfg, steps=tuple(steps))


# --- declared dimensions (fuzz.dimensions): the pairs the ci profile reaches on purpose ---------------------------

TRANSITIONS = ("fresh", "repeat", "decode", "shrink", "grow")
LENS_CLASSES = ("plain", "empty", "at-topk")


def _transition(prev: MetadataStep | None, last: MetadataStep) -> str:
    if prev is None:
        return "fresh"
    pq, ps, q, s = list(prev.q_lens), list(prev.seq_lens), list(last.q_lens), list(last.seq_lens)
    if (pq, ps) == (q, s):
        return "repeat"
    if len(q) == len(pq) and all(x == 1 for x in q) and s == [0 if x == 0 else x + 1 for x in ps]:
        return "decode"
    if len(q) < len(pq) and (pq[:len(q)], ps[:len(q)]) == (q, s):
        return "shrink"
    if len(q) > len(pq) and (q[:len(pq)], s[:len(pq)]) == (pq, ps):
        return "grow"
    return "fresh"


def _lens_class(step: MetadataStep, topk: int) -> str:
    if any(x == 0 for x in step.seq_lens):
        return "empty"
    if any(topk - 1 <= x <= topk + 1 for x in step.seq_lens):
        return "at-topk"
    return "plain"


#: query_start_loc (and its host copy), seq_lens (and seq_lens_cpu), the block table and the top-k rows packed;
#: leading slices of wider persistent buffers (entries past the live ones, and block-table columns past the
#: request's blocks, as vLLM's persistent batch leaves them); stride-2 vectors and a column-major block table
META_LAYOUTS = ("contiguous", "persistent-slice", "strided")


def lay_out_ints(t: torch.Tensor, layout: str, fill: int) -> torch.Tensor:
    """An int vector or table with the same values in the memory of ``layout`` (a persistent slice's extra entries
    ``fill``)."""
    if layout == "persistent-slice":
        if t.dim() == 1:
            wide = torch.full((t.shape[0] + 3,), fill, dtype=t.dtype, device=t.device)
            wide[:t.shape[0]] = t
            return wide[:t.shape[0]]
        wide = torch.full((t.shape[0] + 2, t.shape[1] + 3), fill, dtype=t.dtype, device=t.device)
        wide[:t.shape[0], :t.shape[1]] = t
        return wide[:t.shape[0], :t.shape[1]]
    if layout == "strided":
        if t.dim() == 1:
            # the gaps repeat each entry: a reader that ignores the stride gets real but wrong offsets and lengths
            # (a non-decreasing query_start_loc), never values that send a trusting kernel out of its buffers
            # (gaps of junk corrupt the interpreter's heap through upstream's unchecked writes)
            return torch.stack([t, t], dim=1).reshape(-1)[::2]
        return t.t().contiguous().t()
    return t


def classify_metadata(case: MetadataCase, target) -> dict:
    """The dimension values a metadata case hits: how its last step follows the one before, and that step's
    host lengths, hole placement and length class; the builder's block size and head count."""
    steps, cfg = case.steps, case.config
    last = steps[-1]
    return {"transition": _transition(steps[-2] if len(steps) > 1 else None, last), "host_lens": last.host_lens,
            "holes": last.holes, "lens": _lens_class(last, cfg.topk), "block_size": cfg.block_size,
            "heads": cfg.num_heads, "meta_layout": last.layout}


def force_metadata(case: MetadataCase, combo: dict, target) -> MetadataCase:
    """``case`` with its last two steps replaced: a fresh step holding the length class, then the transition's op
    with the host lengths and holes of ``combo``; block size and heads set on the configuration."""
    import dataclasses

    cfg = dataclasses.replace(case.config, block_size=combo.get("block_size", case.config.block_size),
                              num_heads=combo.get("heads", case.config.num_heads))
    lens = combo.get("lens", "plain")
    mid = {"plain": "topk+10", "empty": "empty", "at-topk": "topk+0"}[lens]
    seed = case.steps[-1].seed
    prev = apply_op(None, MetadataOp(op="fresh", host_lens=True, holes="prefix", seed=seed,
                                     reqs=((1, "topk+10"), (2, mid), (1, "topk+12"))), cfg)
    kind = combo.get("transition", "repeat")
    host, holes = combo.get("host_lens", True), combo.get("holes", "prefix")
    if kind == "fresh":
        op = MetadataOp(op="fresh", host_lens=host, holes=holes, seed=seed + 1,
                        reqs=((2, "topk+13"), (1, mid)))
    else:
        op = MetadataOp(op=kind, host_lens=host, holes=holes, seed=seed + 1, keep=2,
                        reqs=((1, "topk+11"),))
    last = dataclasses.replace(apply_op(prev, op, cfg), layout=combo.get("meta_layout", case.steps[-1].layout))
    return MetadataCase(config=cfg, steps=tuple(case.steps[:-2]) + (prev, last))


def _declare_metadata():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "sparse-metadata",
        (Dimension("transition", TRANSITIONS, "how the last step follows the one before (the step-sequence shape)"),
         Dimension("host_lens", (True, False), "seq_lens_cpu passed, or missing"),
         Dimension("holes", HOLE_MODES, "where the -1 holes of the top-k rows go"),
         Dimension("lens", LENS_CLASSES, "the last step's lengths: an empty sequence, one at topk +-1, neither"),
         Dimension("block_size", (1, 3)),
         Dimension("heads", (2, 16, 17)),
         Dimension("meta_layout", META_LAYOUTS, "the last step's offsets, lengths, block table and top-k rows: "
                                                "packed, persistent-buffer slices, strided / column-major")),
        (("transition", "host_lens"), ("transition", "holes"), ("transition", "lens"), ("block_size", "heads"),
         ("meta_layout", "host_lens")),
        classify_metadata, force_metadata), "shrink-tail-extents")


METADATA_DIMENSIONS = _declare_metadata()


# --- cache-key-staleness: the key probe of the last two steps -------------------------------------------------------

#: how the last step meets the cached key of the one before: "repeat" (the same step: a true hit), or a pair equal
#: under one weakening of :data:`KEY_WEAKENINGS` with different sparse lengths (a correct key must recompute);
#: "other" for anything else
STALENESS_PROBES = ("repeat",) + KEY_WEAKENINGS
#: the order :func:`_probe` tries them in: a weakening that drops more collides with more pairs, so the narrower
#: ones are named first (a clamp-1 pair also collides with the clamped lengths dropped, say)
_PROBE_ORDER = ("clamp-1", "clamped-hostless", "drop:num_tokens", "drop:starts", "drop:clamped")


def _probe(prev: MetadataStep | None, last: MetadataStep, cfg: MetadataConfig) -> str:
    if prev is None:
        return "other"
    if (prev.q_lens, prev.seq_lens) == (last.q_lens, last.seq_lens):
        return "repeat"
    if step_sparse_lengths(prev, cfg.topk) == step_sparse_lengths(last, cfg.topk):
        return "other"
    for w in _PROBE_ORDER:
        if w == "clamped-hostless" and (prev.host_lens or last.host_lens):
            continue
        if step_key(prev, cfg, w) == step_key(last, cfg, w):
            return w
    return "other"


def classify_staleness(case: MetadataCase, target) -> dict:
    """The dimension values a staleness case hits: the key probe of its last two steps, the last step's host
    lengths, holes and padding past R; the builder's block size, head count and kv granularity."""
    steps, cfg = case.steps, case.config
    last = steps[-1]
    return {"probe": _probe(steps[-2] if len(steps) > 1 else None, last, cfg), "host_lens": last.host_lens,
            "holes": last.holes, "padded": last.pad > 0, "block_size": cfg.block_size, "heads": cfg.num_heads,
            "granularity": cfg.granularity, "meta_layout": last.layout}


def force_staleness(case: MetadataCase, combo: dict, target) -> MetadataCase:
    """``case`` with its last steps replaced by a probe pair: a setup step (:func:`_setup`) and its successor under
    the combo's probe (:func:`_collide`; the setup step again for "repeat"), with the host lengths, holes and
    padding of ``combo`` on the last step; block size, heads and granularity set on the configuration. Earlier
    steps of ``case`` stay (at most two, so a forced case costs what a drawn one does)."""
    cfg = dataclasses.replace(case.config, block_size=combo.get("block_size", case.config.block_size),
                              num_heads=combo.get("heads", case.config.num_heads),
                              granularity=combo.get("granularity", case.config.granularity))
    probe = combo.get("probe", "repeat")
    last0 = case.steps[-1]
    host = combo.get("host_lens", last0.host_lens)
    holes = combo.get("holes", last0.holes)
    pad = (2 if combo["padded"] else 0) if "padded" in combo else last0.pad
    keep = tuple(case.steps[:-1])[-2:]
    for attempt in range(64):
        rng = random.Random(last0.seed * 131 + attempt)
        w = "drop:clamped" if probe == "repeat" else probe
        prev = _setup(MetadataStep(q_lens=(1,), seq_lens=(1,)), w, cfg, rng)
        if probe not in ("clamped-hostless",):
            prev = dataclasses.replace(prev, host_lens=True)
        nxt = prev if probe == "repeat" else _collide(prev, w, cfg, rng)
        if nxt is None:
            continue
        nxt = dataclasses.replace(nxt, host_lens=False if probe == "clamped-hostless" else host, holes=holes,
                                  pad=pad, seed=nxt.seed + 1 if probe == "repeat" else nxt.seed,
                                  layout=combo.get("meta_layout", last0.layout))
        out = MetadataCase(config=cfg, steps=keep + (prev, nxt))
        if _probe(prev, nxt, cfg) == probe:
            return out
    raise AssertionError(f"no probe pair {probe!r} for {cfg}")  # pragma: no cover - tests/test_reach.py


def _staleness_allowed(c: dict, target) -> bool:
    return not (c.get("probe") == "clamped-hostless" and c.get("host_lens") is True)


def _staleness_examples(target) -> list[MetadataCase]:
    cfg = MetadataConfig(seed=0, topk=8, granularity=8, block_size=1, num_heads=2)
    return [MetadataCase(config=cfg, steps=(MetadataStep(q_lens=(1,), seq_lens=(1,)),)),
            MetadataCase(config=dataclasses.replace(cfg, topk=24), steps=(
                MetadataStep(q_lens=(2, 1), seq_lens=(5, 30), seed=3),) * 3)]


def _declare_staleness():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "sparse-metadata-staleness",
        (Dimension("probe", STALENESS_PROBES, "the last two steps: the same step (a true hit), or equal under one "
                   "weakening of the cache key with different sparse lengths (a correct key recomputes)"),
         Dimension("host_lens", (True, False), "seq_lens_cpu passed on the last step, or missing (a counted copy)"),
         Dimension("holes", HOLE_MODES, "where the -1 holes of the last step's top-k rows go"),
         Dimension("padded", (False, True), "query_start_loc, seq_lens and the block table padded past R"),
         Dimension("block_size", (1, 3)),
         Dimension("heads", (2, 16, 17), "below, at and past the 16 heads q is padded to"),
         Dimension("granularity", (8, 16), "the kv granule of the work partition"),
         Dimension("meta_layout", META_LAYOUTS, "the last step's offsets, lengths, block table and top-k rows: "
                                                "packed, persistent-buffer slices, strided / column-major")),
        (("probe", "host_lens"), ("probe", "holes"), ("probe", "padded"), ("block_size", "heads"),
         ("meta_layout", "padded"), ("meta_layout", "host_lens")),
        classify_staleness, force_staleness, _staleness_allowed, _staleness_examples), "cache-key-staleness")


STALENESS_DIMENSIONS = _declare_staleness()
