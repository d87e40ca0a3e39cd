"""Strategies for the sparse metadata builder: a builder configuration and sequences of scheduler steps.

A step is plain JSON: ``{"q_lens", "seq_lens", "host_lens", "holes", "seed"}``. Steps are produced from the previous
one by *ops* (also JSON, all randomness inside), through the deterministic :func:`apply_op`; the contract's case
generator and the RuleBasedStateMachine in the tests draw the same ops and use the same function. The ops aim at the
states where cached metadata goes stale: steady decode (hits), lengths crossing ``topk``, the same clamped lengths
with a different query-length distribution, the last request's query length changed (same starts), batches growing
and shrinking, empty sequences, and ``seq_lens_cpu`` missing.
"""
from __future__ import annotations

import random

from hypothesis import strategies as st

MAX_TOKENS = 16
MAX_Q = 4
HOLE_MODES = ("prefix", "anywhere", "fewer")


def config_strategy() -> st.SearchStrategy:
    return st.fixed_dictionaries({
        "seed": st.integers(0, 2**31 - 1),
        "topk": st.sampled_from([24, 4, 7, 40]),
        "granularity": st.sampled_from([8, 16]),
        "block_size": st.sampled_from([1, 3]),
        "max_tokens": st.just(MAX_TOKENS),
        "num_heads": st.sampled_from([2, 16, 17]),
    })


def _common() -> dict:
    return {"host_lens": st.booleans(), "holes": st.sampled_from(HOLE_MODES), "seed": st.integers(0, 2**31 - 1)}


_seq_code = st.one_of(st.just("empty"), st.integers(-2, 3).map(lambda d: f"topk{d:+d}"), st.integers(1, 48))
_req = st.tuples(st.integers(1, MAX_Q), _seq_code).map(list)

OP_STRATEGIES: dict[str, st.SearchStrategy] = {
    "fresh": st.fixed_dictionaries({"op": st.just("fresh"), "reqs": st.lists(_req, min_size=2, max_size=5),
                                    **_common()}),
    "decode": st.fixed_dictionaries({"op": st.just("decode"), **_common()}),
    "repeat": st.fixed_dictionaries({"op": st.just("repeat"), **_common()}),
    "permute_q": st.fixed_dictionaries({"op": st.just("permute_q"), "perm_seed": st.integers(0, 1000),
                                        **_common()}),
    "retime_last": st.fixed_dictionaries({"op": st.just("retime_last"), "q": st.integers(1, MAX_Q), **_common()}),
    "shrink": st.fixed_dictionaries({"op": st.just("shrink"), "keep": st.integers(1, 4), **_common()}),
    "grow": st.fixed_dictionaries({"op": st.just("grow"), "reqs": st.lists(_req, min_size=1, max_size=3),
                                   **_common()}),
    "cross_topk": st.fixed_dictionaries({"op": st.just("cross_topk"), "delta": st.integers(-2, 3), **_common()}),
}


def op_strategy() -> st.SearchStrategy:
    return st.one_of(*OP_STRATEGIES.values())


def _seq_from_code(code, q: int, topk: int) -> int:
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


def apply_op(prev: dict | None, op: dict, cfg: dict) -> dict:
    """The concrete step ``op`` makes from ``prev`` (None: the first step; any op then acts as ``fresh``)."""
    topk, max_tokens = cfg["topk"], cfg["max_tokens"]
    kind = op["op"]
    if prev is None and kind not in ("fresh",):
        kind = "fresh"
        op = {**op, "reqs": op.get("reqs") or [[1, 5], [2, f"topk{0:+d}"]]}
    if kind == "fresh":
        q = [r[0] for r in op["reqs"]]
        s = [_seq_from_code(r[1], r[0], topk) for r in op["reqs"]]
    else:
        q, s = list(prev["q_lens"]), list(prev["seq_lens"])
        if kind == "decode":
            s = [0 if x == 0 else x + 1 for x in s]
            q = [1] * len(q)
        elif kind == "permute_q":
            rng = random.Random(op["perm_seed"])
            rng.shuffle(q)
        elif kind == "retime_last":
            # Same request starts; max_query_len kept when another request sets it (the key's other fields).
            cap = MAX_Q if len(q) == 1 else max(q[:-1])
            shift = 1 + (op["q"] - 1) % (cap - 1) if cap > 1 else 0  # always a different length when possible
            new_q = 1 + (q[-1] - 1 + shift) % cap
            q[-1] = new_q if s[-1] == 0 else min(new_q, s[-1])
        elif kind == "shrink":
            q, s = q[:op["keep"]], s[:op["keep"]]
        elif kind == "grow":
            q = q + [r[0] for r in op["reqs"]]
            s = s + [_seq_from_code(r[1], r[0], topk) for r in op["reqs"]]
        elif kind == "cross_topk":
            s = [0 if x == 0 else topk + op["delta"] + (qq - 1) for x, qq in zip(s, q)]
    q, s = _fix(q, s, max_tokens)
    return {"q_lens": q, "seq_lens": s, "host_lens": bool(op["host_lens"]), "holes": op["holes"],
            "seed": int(op["seed"])}


@st.composite
def metadata_case(draw, min_steps: int = 2, max_steps: int = 6) -> dict:
    """A builder configuration and a sequence of concrete steps."""
    cfg = draw(config_strategy())
    n = draw(st.integers(min_steps, max_steps))
    steps: list[dict] = []
    prev = None
    for _ in range(n):
        prev = apply_op(prev, draw(op_strategy()), cfg)
        steps.append(prev)
    return {"config": cfg, "steps": steps}
